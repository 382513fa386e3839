//! The deterministic random stream every crate's fuzz tests draw from (xorshift64*): a failing
//! round replays exactly from its seed, and no test depends on an RNG crate's version.

/// An endless stream of pseudo-random `u64`s from `seed` (any value but 0).
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.max(1);
    move || {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
}

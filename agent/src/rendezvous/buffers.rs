//! Receive buffers for large tensors, reused.
//!
//! A received tensor's buffer was a fresh allocation each time, and one of 64 MiB is a fresh
//! mapping: the kernel clears every page of it before the socket's bytes are copied in. `perf` on
//! the receiving `link-worker` showed the page clearing (`clear_page_erms` and the page faults) as
//! large as the socket copy itself. A buffer of [`POOLED_MIN`] bytes or more now goes back to its
//! worker's pool when the last reference to the tensor's bytes is dropped, and the next large
//! receive fills it again, over pages already mapped.
//!
//! The pool keeps at most [`IDLE_BYTES`] of idle buffers; the rest are freed as before. Buffers
//! smaller than [`POOLED_MIN`] come from the allocator, which reuses them well enough.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;

/// The smallest buffer the pool keeps.
pub const POOLED_MIN: usize = 4 << 20;
/// The most idle capacity the pool keeps (three 64 MiB tensors' worth: two receives outstanding
/// and one being used, as `coord-bench rendezvous` does).
pub const IDLE_BYTES: usize = 192 << 20;

/// A worker's idle receive buffers.
#[derive(Default)]
pub struct BufferPool {
    idle: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// An empty buffer that can hold `capacity` bytes: an idle one large enough (the smallest
    /// such), or a new one.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        if capacity >= POOLED_MIN {
            let mut idle = self.lock();
            let best = (0..idle.len())
                .filter(|&i| idle[i].capacity() >= capacity)
                .min_by_key(|&i| idle[i].capacity());
            if let Some(i) = best {
                let mut v = idle.swap_remove(i);
                v.clear();
                return v;
            }
        }
        new_buffer(capacity)
    }

    /// `data` as a tensor's bytes; a large buffer comes back to `pool` when they are dropped.
    pub fn freeze(pool: &Arc<Self>, data: Vec<u8>) -> Bytes {
        if data.capacity() < POOLED_MIN {
            return Bytes::from(data);
        }
        Bytes::from_owner(Pooled {
            data,
            pool: Arc::downgrade(pool),
        })
    }

    /// Keeps `data` for a later receive, if the pool has room for it.
    fn give_back(&self, data: Vec<u8>) {
        let mut idle = self.lock();
        let held: usize = idle.iter().map(Vec::capacity).sum();
        if held + data.capacity() <= IDLE_BYTES {
            idle.push(data);
        }
    }

    /// Idle buffers now (for tests).
    pub fn idle(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        // Nothing panics while holding the lock; a poisoned list is still a list.
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The owner of a pooled tensor's bytes.
struct Pooled {
    data: Vec<u8>,
    pool: Weak<BufferPool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.give_back(std::mem::take(&mut self.data));
        }
    }
}

/// An empty buffer for `capacity` bytes. A large one is advised to the kernel as a candidate for
/// transparent huge pages: filling 64 MiB then takes a few dozen page faults instead of 16,384.
fn new_buffer(capacity: usize) -> Vec<u8> {
    let mut v = Vec::<u8>::with_capacity(capacity);
    #[cfg(target_os = "linux")]
    if capacity >= 4 << 20 {
        const PAGE: usize = 4096;
        let start = v.as_mut_ptr() as usize;
        let aligned = start.next_multiple_of(PAGE);
        let len = (start + capacity).saturating_sub(aligned) / PAGE * PAGE;
        // SAFETY: madvise only advises on pages inside this Vec's own allocation (the range is
        // rounded inward to page boundaries); it changes neither contents nor mappings. Failure
        // (e.g. no THP in this kernel) is harmless and ignored.
        unsafe {
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_buffers_come_back_and_small_ones_do_not() {
        let pool = Arc::new(BufferPool::default());
        let mut v = pool.take(POOLED_MIN);
        v.extend(std::iter::repeat_n(7u8, POOLED_MIN));
        let ptr = v.as_ptr();
        let bytes = BufferPool::freeze(&pool, v);
        let copy = bytes.clone();
        drop(bytes);
        assert_eq!(pool.idle(), 0, "still referenced");
        assert!(copy.iter().all(|&b| b == 7));
        drop(copy);
        assert_eq!(pool.idle(), 1);
        // Reused: same memory, emptied.
        let again = pool.take(POOLED_MIN);
        assert_eq!((again.as_ptr(), again.len()), (ptr, 0));

        let small = BufferPool::freeze(&pool, vec![1u8; 16]);
        drop(small);
        assert_eq!(pool.idle(), 0);

        // Never more than IDLE_BYTES idle.
        let many: Vec<Bytes> = (0..=IDLE_BYTES / POOLED_MIN)
            .map(|_| BufferPool::freeze(&pool, pool.take(POOLED_MIN)))
            .collect();
        drop(many);
        assert_eq!(pool.idle(), IDLE_BYTES / POOLED_MIN);
    }
}

//! Measures what one durable log append costs with sled: insert, sled flush, fdatasync.
//! `cargo run --release -p coord-raft-store --example sync_probe`

use std::fs::File;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = 3000u64;
    let value = vec![7u8; 400];
    for (label, fsync, flush) in [
        ("insert+flush+fdatasync", true, true),
        ("insert+flush", false, true),
        ("insert+flush+fdatasync", true, true),
    ] {
        let dir = tempfile::tempdir()?;
        let db = sled::Config::new()
            .path(dir.path())
            .cache_capacity(64 << 20)
            .flush_every_ms(None)
            .open()?;
        let tree = db.open_tree("logs")?;
        let file = File::open(dir.path().join("db"))?;
        let mut lat = Vec::new();
        for i in 0..n {
            let t = Instant::now();
            tree.insert(i.to_be_bytes(), value.as_slice())?;
            if flush {
                db.flush()?;
            }
            if fsync {
                file.sync_data()?;
            }
            lat.push(t.elapsed().as_micros() as u64);
        }
        lat.sort_unstable();
        println!(
            "{label:28} p50 {:>5} us  p90 {:>5} us  mean {:>5} us",
            lat[lat.len() / 2],
            lat[lat.len() * 9 / 10],
            lat.iter().sum::<u64>() / n
        );
    }
    Ok(())
}

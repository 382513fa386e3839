//! Closed-loop load: N clients, each sending its next request when the previous one returned, until
//! a fixed number of operations is done. Reports throughput and latency percentiles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::KvTarget;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Put,
    Get,
}

/// Keys the get benchmark reads; [`preload`] writes them first.
pub const GET_KEYS: usize = 1000;
pub const VALUE_BYTES: usize = 256;

#[derive(Clone, Debug)]
pub struct LoadResult {
    pub ops: usize,
    pub errors: usize,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

impl LoadResult {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

fn value() -> Bytes {
    Bytes::from(vec![b'v'; VALUE_BYTES])
}

/// Writes the keys the get benchmark reads.
pub async fn preload<T: KvTarget>(target: &Arc<T>) -> Result<(), String> {
    for i in 0..GET_KEYS {
        target.put(0, format!("bench/get/{i}"), value()).await?;
    }
    Ok(())
}

/// Runs `ops` operations of `kind` from `clients` closed-loop clients.
pub async fn run<T: KvTarget>(
    target: Arc<T>,
    kind: OpKind,
    clients: usize,
    ops: usize,
) -> LoadResult {
    let per_client = ops.div_ceil(clients);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let target = target.clone();
            tokio::spawn(async move {
                let conn = c % target.connections();
                let mut latencies = Vec::with_capacity(per_client);
                let mut errors = 0;
                let mut rng_state = (c as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                for i in 0..per_client {
                    let t0 = Instant::now();
                    let r = match kind {
                        OpKind::Put => {
                            target
                                .put(conn, format!("bench/put/{c}/{}", i % 64), value())
                                .await
                        }
                        OpKind::Get => {
                            rng_state ^= rng_state << 13;
                            rng_state ^= rng_state >> 7;
                            rng_state ^= rng_state << 17;
                            target
                                .get(conn, format!("bench/get/{}", rng_state % GET_KEYS as u64))
                                .await
                        }
                    };
                    match r {
                        Ok(()) => latencies.push(t0.elapsed()),
                        Err(_) => errors += 1,
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut all = Vec::with_capacity(per_client * clients);
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, e)) = t.await {
            all.extend(l);
            errors += e;
        }
    }
    let elapsed = started.elapsed();
    all.sort_unstable();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    LoadResult {
        ops: all.len(),
        errors,
        elapsed,
        p50: pct(0.50),
        p99: pct(0.99),
    }
}

//! The longest write gap a client sees when the leader is killed.
//!
//! Clients write in closed loops; the leader gets kill -9; each client's gap is the longest time
//! between two of its acknowledged writes around the kill. The result for one kill is the worst
//! client's gap. The killed member is restarted and caught up before the next kill.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Ensemble, KvTarget};

/// Acknowledgements every client must see after a kill before the round ends.
const ACKS_AFTER_KILL: usize = 20;
const ROUND_LIMIT: Duration = Duration::from_secs(30);

/// One failover round's outcome.
#[derive(Clone, Debug)]
pub struct Gap {
    pub killed: String,
    pub worst_gap: Duration,
    /// Clients that did not recover within the round limit (then `worst_gap` is a lower bound).
    pub stuck_clients: usize,
}

pub async fn measure<T: KvTarget, E: Ensemble>(
    target: Arc<T>,
    ensemble: &mut E,
    clients: usize,
    kills: usize,
) -> Vec<Gap> {
    let mut gaps = Vec::with_capacity(kills);
    for round in 0..kills {
        let stop = Arc::new(AtomicBool::new(false));
        let acks: Vec<Arc<Mutex<Vec<Instant>>>> = (0..clients).map(|_| Arc::default()).collect();
        let tasks: Vec<_> = (0..clients)
            .map(|c| {
                let (target, stop, acks) = (target.clone(), stop.clone(), acks[c].clone());
                tokio::spawn(async move {
                    let conn = c % target.connections();
                    let mut i = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("bench/failover/{round}/{c}/{}", i % 64);
                        if target
                            .put(conn, key, Bytes::from_static(&[b'f'; 256]))
                            .await
                            .is_ok()
                        {
                            acks.lock().map(|mut a| a.push(Instant::now())).ok();
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let killed_at = Instant::now();
        let killed = ensemble.kill_leader().await;
        let deadline = Instant::now() + ROUND_LIMIT;
        loop {
            let done = acks.iter().all(|a| {
                a.lock()
                    .map(|a| a.iter().filter(|t| **t > killed_at).count() >= ACKS_AFTER_KILL)
                    .unwrap_or(false)
            });
            if done || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let mut stuck_clients = 0;
        let mut worst_gap = Duration::ZERO;
        for a in &acks {
            let a = a.lock().map(|a| a.clone()).unwrap_or_default();
            // The last ack before the kill, and every ack after it.
            let before = a
                .iter()
                .rev()
                .find(|t| **t <= killed_at)
                .copied()
                .unwrap_or(killed_at);
            let mut prev = before;
            let mut after = 0;
            for t in a.iter().filter(|t| **t > killed_at) {
                worst_gap = worst_gap.max(t.duration_since(prev));
                prev = *t;
                after += 1;
            }
            if after < ACKS_AFTER_KILL {
                stuck_clients += 1;
                worst_gap = worst_gap.max(Instant::now().duration_since(prev));
            }
        }
        for t in tasks {
            t.abort();
        }
        gaps.push(Gap {
            killed,
            worst_gap,
            stuck_clients,
        });
        ensemble.recover().await;
    }
    gaps
}

/// The median of the worst gaps.
pub fn median(gaps: &[Gap]) -> Duration {
    let mut v: Vec<Duration> = gaps.iter().map(|g| g.worst_gap).collect();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

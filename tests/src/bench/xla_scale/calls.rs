//! The calls each simulated task makes on its own as jaxlib's client makes them: RegisterTask,
//! tried again on UNAVAILABLE, and heartbeats on jaxlib's schedule.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_proto::xla::coordination as xla;

use super::super::tasks::Spawned;
use super::wire::{id, incarnation, incarnations, Client};

/// Task `i`'s RegisterTask as jaxlib's `connect()` sends it (its incarnation and id, nothing
/// else); returns the service incarnation. Like jaxlib, it tries again on UNAVAILABLE (an error
/// without the coordination payload, which jaxlib takes for a transport error), here for a
/// minute: a new ensemble answers that until its cluster configuration is committed.
pub(super) async fn register(
    mut c: Client,
    i: usize,
    retries: Arc<AtomicU64>,
) -> Result<u64, tonic::Status> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let req = xla::RegisterTaskRequest {
            incarnation: incarnation(i),
            source_task_id: id(i),
        };
        match c.register_task(req).await {
            Ok(r) => return Ok(r.into_inner().service_incarnation),
            Err(e) if e.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                if retries.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("RegisterTask of task {i} retried: {}", e.message());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Task `i`'s heartbeats, the first after `first`, then one `every` after the last answer (as
/// jaxlib's heartbeat thread waits); failures are counted. Each carries the task's incarnation
/// in both places the schema has for it.
pub(super) fn heartbeat(
    mut c: Client,
    i: usize,
    service: u64,
    first: Duration,
    every: Duration,
    errors: Arc<AtomicU64>,
) -> Spawned<()> {
    Spawned::new(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let req = xla::HeartbeatRequest {
                incarnations: incarnations(i, service),
                incarnation: incarnation(i),
                source_task_id: id(i),
            };
            if c.heartbeat(req).await.is_err() {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

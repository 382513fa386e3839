//! While this replica leads: releases iteration clients silent past the client timeout and
//! garbage-collects iterations left without clients past the collection timeout (TensorFlow's
//! maintenance thread). Each decision is a committed op, so every replica agrees on it; a new
//! leader judges afresh after a full timeout of grace, as TF does after a restart.
//!
//! DYNAMIC iterations are never collected, as in TF (`gc_dynamic_sharding_jobs` is off): their
//! visitation guarantee would not survive being made again. A worker silent past the worker
//! timeout is declared lost: new iterations make no task on it (TensorFlow forgets only its
//! heartbeat time; an ensemble outlives the jobs whose workers are gone).

use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::tfdata::{sharding, TfDataOp};
use coord_raft_store::Op;

use super::{now_micros, TfDataCore};
use crate::raft::leader::{LeaderWatch, Leadership};

fn propose(core: &Arc<TfDataCore>, op: TfDataOp) {
    core.proposer.propose_decision(Op::TfData(op));
}

pub async fn run(core: Arc<TfDataCore>, leader: LeaderWatch) {
    let every = Duration::from_millis((core.config.client_timeout_ms / 4).clamp(20, 1000));
    let mut leading = false;
    loop {
        let now_leading = leader.current() == Leadership::Me;
        if now_leading && !leading {
            core.memory.start_leading();
        } else if !now_leading && leading {
            core.memory.stop_leading();
        }
        leading = now_leading;
        if leading {
            judge(&core);
        }
        tokio::time::sleep(every).await;
    }
}

fn judge(core: &Arc<TfDataCore>) {
    let now = now_micros();
    let gc_after = i64::try_from(core.config.iteration_gc_timeout_ms)
        .unwrap_or(i64::MAX)
        .saturating_mul(1000);
    let (active, idle, present): (Vec<i64>, Vec<i64>, Vec<String>) = core.reader.read(|a| {
        let s = &a.state.tfdata;
        let present = s
            .workers
            .iter()
            .filter(|(_, w)| !w.lost)
            .map(|(a, _)| a.clone())
            .collect();
        let idle = s
            .iterations
            .values()
            .filter(|it| !it.finished && it.num_clients == 0 && it.last_client_released_micros >= 0)
            .filter(|it| {
                s.jobs
                    .get(&it.job)
                    .is_some_and(|j| j.sharding != sharding::DYNAMIC)
            })
            .filter(|it| now > it.last_client_released_micros.saturating_add(gc_after))
            .map(|it| it.id)
            .collect();
        (s.active_clients().collect(), idle, present)
    });
    let worker_timeout = Duration::from_millis(core.config.worker_timeout_ms);
    for address in core.memory.overdue_workers(&present, worker_timeout) {
        tracing::warn!(worker = %address, "tf.data worker missed its heartbeats; new iterations get no task on it until it is back");
        propose(core, TfDataOp::WorkerLost { address });
    }
    let timeout = Duration::from_millis(core.config.client_timeout_ms);
    for client in core.memory.overdue_clients(&active, timeout) {
        tracing::warn!(
            client,
            "tf.data iteration client missed its heartbeats; releasing it"
        );
        propose(
            core,
            TfDataOp::ReleaseClient {
                client,
                time_micros: now,
            },
        );
    }
    for iteration in idle {
        tracing::info!(
            iteration,
            "tf.data iteration had no clients for the collection timeout; collecting it"
        );
        propose(core, TfDataOp::GarbageCollectIteration { iteration });
    }
}

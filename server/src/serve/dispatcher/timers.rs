//! While this replica leads: declares silent workers dead, releases silent clients and collects
//! jobs left without clients. Each decision is a committed update, so every replica agrees on
//! it; a new leader judges afresh after a full timeout of grace.

use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::dispatcher::{DispatchOp, Mode};
use coord_raft_store::Op;

use super::DispatchCore;
use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::proposer::now_ms;

fn propose(core: &Arc<DispatchCore>, op: DispatchOp) {
    core.proposer.propose_decision(Op::Dispatch(op));
}

pub async fn run(core: Arc<DispatchCore>, leader: LeaderWatch) {
    let cfg = core.config;
    let every = Duration::from_millis((cfg.worker_timeout_ms / 4).clamp(20, 1000));
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
            judge(&core, now_ms());
        }
        tokio::time::sleep(every).await;
    }
}

fn judge(core: &Arc<DispatchCore>, now_ms: u64) {
    let cfg = core.config;
    let (live, clients, idle): (Vec<(String, u64)>, Vec<u64>, Vec<u64>) = core.reader.read(|a| {
        let s = &a.state.dispatcher;
        let live = s
            .workers
            .iter()
            .filter(|(_, w)| w.alive)
            .map(|(a, w)| (a.clone(), w.id))
            .collect();
        let clients = s.clients.keys().copied().collect();
        // DYNAMIC jobs are never collected (as in TF): their split position would be lost.
        let idle = s
            .jobs
            .values()
            .filter(|j| !j.finished && j.mode != Mode::Dynamic && j.clients.is_empty())
            .filter(|j| {
                j.idle_since_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) > cfg.job_gc_timeout_ms)
            })
            .map(|j| j.id)
            .collect();
        (live, clients, idle)
    });
    for (address, worker_id) in core
        .memory
        .overdue_workers(&live, Duration::from_millis(cfg.worker_timeout_ms))
    {
        tracing::warn!(worker = %address, worker_id, "data worker missed its heartbeats; declaring it dead and re-issuing its splits");
        propose(core, DispatchOp::WorkerTimeout { address, worker_id });
    }
    for client in core
        .memory
        .overdue_clients(&clients, Duration::from_millis(cfg.client_timeout_ms))
    {
        tracing::warn!(client, "job client missed its heartbeats; releasing it");
        propose(core, DispatchOp::ClientTimeout { client });
    }
    for job in idle {
        tracing::info!(
            job,
            "job had no clients for the collection timeout; collecting it"
        );
        propose(core, DispatchOp::CollectJob { job });
    }
}

//! While this replica leads: declares silent workers lost, releases silent clients and collects
//! iterations left without clients (TensorFlow's maintenance thread). Each decision is a
//! committed op, so every replica agrees on it; a new leader judges afresh after a full timeout
//! of grace, as TF does after a restart.
//!
//! A worker's timeout is its kind's: a coord data worker silent past `--dispatcher-worker-
//! timeout-ms` is dead and its leased splits go out again; a TensorFlow worker silent past
//! `--tfdata-worker-timeout-ms` gets no task of new iterations until it is back (TensorFlow
//! forgets only its heartbeat time; an ensemble outlives the jobs whose workers are gone).
//! DYNAMIC iterations are never collected, as in TF (`gc_dynamic_sharding_jobs` is off): their
//! visitation guarantee would not survive being made again.
//!
//! Every namespace's dispatcher is judged on each tick, against its own memory, and each decision
//! is bound to its namespace: this task runs outside every call's binding.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::dispatcher::{sharding, DispatcherOp, DispatcherState};
use coord_raft_store::Op;

use super::memory::Memory;
use super::{now_micros, DispatcherCore};
use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::namespace::{self, Ns};

fn propose(core: &DispatcherCore, ns: &Ns, op: DispatcherOp) {
    core.proposer
        .propose_decision(namespace::bind_to(ns, Op::Dispatcher(op)));
}

pub async fn run(core: Arc<DispatcherCore>, leader: LeaderWatch) {
    let cfg = &core.config;
    let shortest = cfg
        .client_timeout_ms
        .min(cfg.data_worker_timeout_ms)
        .min(cfg.tf_worker_timeout_ms);
    let every = Duration::from_millis((shortest / 4).clamp(20, 1000));
    let mut leading = false;
    loop {
        let now_leading = leader.current() == Leadership::Me;
        if now_leading && !leading {
            core.memories.start_leading();
        } else if !now_leading && leading {
            core.memories.stop_leading();
        }
        leading = now_leading;
        if leading {
            judge(&core);
        }
        tokio::time::sleep(every).await;
    }
}

/// What the leader judges: present workers with their timeouts, clients that may time out, and
/// iterations idle past the collection timeout.
struct Candidates {
    workers: Vec<(String, u64, Duration)>,
    /// Those of `workers` that report delivery (coord's data workers).
    delivering: HashSet<String>,
    clients: Vec<i64>,
    idle: Vec<(i64, bool)>,
}

impl Candidates {
    fn is_empty(&self) -> bool {
        self.workers.is_empty() && self.clients.is_empty() && self.idle.is_empty()
    }
}

fn candidates(s: &DispatcherState, cfg: &super::DispatcherConfig, now: i64) -> Candidates {
    let gc_after = i64::try_from(cfg.job_gc_timeout_ms)
        .unwrap_or(i64::MAX)
        .saturating_mul(1000);
    let workers = s
        .workers
        .iter()
        .filter(|(_, w)| !w.lost)
        .map(|(a, w)| {
            let ms = if w.reports_delivery {
                cfg.data_worker_timeout_ms
            } else {
                cfg.tf_worker_timeout_ms
            };
            (a.clone(), w.registration, Duration::from_millis(ms))
        })
        .collect();
    let delivering = s
        .workers
        .iter()
        .filter(|(_, w)| w.reports_delivery)
        .map(|(a, _)| a.clone())
        .collect();
    // TensorFlow releases the clients of unfinished iterations only; coord's clients of a
    // finished job are released too (they hold nothing else).
    let clients = s
        .clients
        .iter()
        .filter(|(_, it)| {
            s.iterations
                .get(it)
                .is_some_and(|it| !it.finished || s.reads_definition(it))
        })
        .map(|(c, _)| *c)
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
        .map(|it| (it.id, s.reads_definition(it)))
        .collect();
    Candidates {
        workers,
        delivering,
        clients,
        idle,
    }
}

/// Judges every namespace's dispatcher (one with nothing to judge costs one look at its state,
/// and nothing is built for it: a tick's allocations follow the namespaces with work, not all).
fn judge(core: &DispatcherCore) {
    let now = now_micros();
    let remembered = core.memories.namespaces();
    let (gone, judged): (Vec<Ns>, Vec<(Ns, Candidates)>) = core.reader.all().read(|a| {
        let gone = remembered
            .into_iter()
            .filter(|ns| !namespace::exists(a, ns))
            .collect();
        let judged = a
            .state
            .spaces()
            .filter_map(|(name, space)| {
                let c = candidates(&space.dispatcher, &core.config, now);
                (!c.is_empty()).then(|| (name.map(Arc::from), c))
            })
            .collect();
        (gone, judged)
    });
    // A deleted namespace's memory goes; a name declared again starts afresh.
    core.memories.forget(&gone);
    for (ns, c) in judged {
        judge_one(core, &ns, &core.memories.of(&ns), c, now);
    }
}

fn judge_one(core: &DispatcherCore, ns: &Ns, memory: &Memory, c: Candidates, now: i64) {
    for (address, registration) in memory.overdue_workers(&c.workers) {
        if c.delivering.contains(&address) {
            tracing::warn!(worker = %address, registration, "data worker missed its heartbeats; declaring it dead and re-issuing its splits");
            propose(
                core,
                ns,
                DispatcherOp::DataWorkerTimeout {
                    address,
                    registration,
                },
            );
        } else {
            tracing::warn!(worker = %address, "tf.data worker missed its heartbeats; new iterations get no task on it until it is back");
            propose(core, ns, DispatcherOp::WorkerLost { address });
        }
    }
    let timeout = Duration::from_millis(core.config.client_timeout_ms);
    for client in memory.overdue_clients(&c.clients, timeout) {
        tracing::warn!(
            client,
            "dispatcher client missed its heartbeats; releasing it"
        );
        propose(
            core,
            ns,
            DispatcherOp::ClientTimeout {
                client,
                time_micros: now,
            },
        );
    }
    for (iteration, definition) in c.idle {
        tracing::info!(
            iteration,
            "iteration had no clients for the collection timeout; collecting it"
        );
        propose(
            core,
            ns,
            if definition {
                DispatcherOp::CollectJob { iteration }
            } else {
                DispatcherOp::GarbageCollectIteration { iteration }
            },
        );
    }
}

//! The client of [`super::alive`]: one sidecar's two tasks of the XLA job, registered on jaxlib's
//! wire, asking GetAliveTasks round after round.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use coord_agent::CoordClient;
use coord_proto::coord::coordination::{AliveSet, XlaAliveAsksRequest};
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient;

use super::alive::{incarnation, AliveRecord, Joined, JOB, TASKS};
use super::history::History;
use super::stopped;

/// Registers the job's tasks, then asks round after round until `stop`.
pub async fn client(c: CoordClient, h: Arc<History>, stop: Arc<AtomicBool>) {
    let Some(service) = register(&c, &stop).await else {
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        let invoke = h.now_us();
        let asks = XlaAliveAsksRequest {
            sets: vec![AliveSet {
                task_ids: (0..TASKS).collect(),
            }],
            asks: (0..TASKS)
                .map(|t| xla::GetAliveTasksRequest {
                    incarnations: Some(xla::Incarnations {
                        task_id: t,
                        task_incarnation: incarnation(t),
                        service_incarnation: service,
                    }),
                    requesting_task_id: t,
                    task_ids: Vec::new(),
                })
                .collect(),
            set: vec![0; TASKS as usize],
            ask_seqs: Vec::new(),
        };
        let recorded = tokio::select! {
            r = c.xla_alive_asks(asks) => r.ok(),
            () = stopped(&stop) => None,
        };
        let joined: Option<Vec<Joined>> = recorded.map(|answers| {
            (answers.iter())
                .map(|a| Joined {
                    round: a.counter,
                    pending: a.pending,
                    error_code: a.error_code,
                })
                .collect()
        });
        h.record_call(
            format!("GetAliveTasks asks of tasks {JOB}/0-{}", TASKS - 1),
            invoke,
            joined.is_some(),
        );
        let complete_us = joined.is_some().then(|| h.now_us());
        let round = joined
            .as_ref()
            .and_then(|j| j.last())
            .filter(|j| j.error_code == 0)
            .map(|j| j.round);
        let answer = match round {
            Some(round) => tokio::select! {
                r = c.await_alive((0..TASKS).collect(), round) => {
                    r.ok().map(|a| (a.alive_task_ids, a.incarnations))
                }
                () = stopped(&stop) => None,
            },
            None => None,
        };
        h.record_alive(AliveRecord {
            invoke_us: invoke,
            complete_us,
            joined,
            answer,
        });
    }
}

/// Registers every task of the job at once (XLA's RegisterTask waits at the register barrier of
/// the whole job), again until all are answered; the service incarnation, `None` if stopped first.
async fn register(c: &CoordClient, stop: &AtomicBool) -> Option<u64> {
    while !stop.load(Ordering::Relaxed) {
        let calls = (0..TASKS).map(|t| {
            let req = xla::RegisterTaskRequest {
                incarnation: incarnation(t),
                source_task_id: t,
            };
            c.forward(req, true, true, |ch, r| async move {
                CoordinationServiceClient::new(ch).register_task(r).await
            })
        });
        let registered = tokio::select! {
            r = futures::future::join_all(calls) => r,
            () = stopped(stop) => return None,
        };
        if let Ok(services) = registered.into_iter().collect::<Result<Vec<_>, _>>() {
            return services.first().map(|s| s.service_incarnation);
        }
    }
    None
}

//! TensorFlow's workers: WorkerHeartbeat (registration, the tasks to start and to drop) and
//! WorkerUpdate (finished tasks).
//!
//! A heartbeat is a read unless it changes something: a worker never seen before (registered,
//! with a task of every unfinished iteration), one that was lost (it gets a task of every
//! unfinished iteration it has none of), or one that lacks a task of a round-robin iteration (it
//! gets a pending one). Its answer is read from the state after that: the tasks assigned to
//! the worker that it does not run yet, and those it runs that are no longer assigned to it.

use std::collections::BTreeSet;

use coord_proto::tensorflow::data as pb;
use coord_raft_store::dispatcher::{DispatcherOp, DispatcherState, WorkerIndex};
use coord_raft_store::state::Code;
use coord_raft_store::RequestId;
use prost::Message;

use super::{status, wire, DispatcherCore};
use crate::error::CoordError;

impl DispatcherCore {
    pub async fn worker_heartbeat(
        &self,
        id: Option<RequestId>,
        req: pb::WorkerHeartbeatRequest,
    ) -> Result<pb::WorkerHeartbeatResponse, CoordError> {
        let address = req.worker_address;
        if address.is_empty() {
            return Err(CoordError::InvalidArgument(
                "WorkerHeartbeat: worker_address must not be empty".into(),
            ));
        }
        self.memory().worker_heard(&address);
        let (known, lost, lacks_a_task, index, rounds) = self
            .read(|s| {
                if s.workers.get(&address).is_some_and(|w| w.reports_delivery) {
                    return Err(status(
                        Code::FailedPrecondition,
                        format!(
                            "worker {address} is registered as a coord data worker; it cannot \
                             heartbeat as one of TensorFlow's"
                        ),
                    ));
                }
                let known = s.workers.contains_key(&address);
                let lost = s.workers.get(&address).is_some_and(|w| w.lost);
                let index = if known {
                    Ok(None)
                } else {
                    worker_index(&self.config.worker_addresses, s, &address)
                };
                Ok((
                    known,
                    lost,
                    !s.round_robin_iterations_without(&address).is_empty(),
                    index,
                    self.memory().iteration_rounds(s),
                ))
            })
            .await??;
        if !known || lost || lacks_a_task {
            let op = DispatcherOp::WorkerHeartbeat {
                address: address.clone(),
                transfer_servers: req
                    .transfer_servers
                    .iter()
                    .map(|t| t.encode_to_vec().into())
                    .collect(),
                tags: req.worker_tags,
                uid: req.worker_uid,
                index: index?,
                rounds,
            };
            self.commit(id, op).await?;
            if !known {
                tracing::info!(worker = %address, "TensorFlow data worker registered");
            } else if lost {
                tracing::info!(worker = %address, "TensorFlow data worker is back");
            }
        }
        let current: BTreeSet<i64> = req.current_tasks.iter().copied().collect();
        self.applied(|s| {
            let assigned = s
                .workers
                .get(&address)
                .map(|w| w.tasks.clone())
                .unwrap_or_default();
            let mut new_tasks = Vec::new();
            for t in assigned.difference(&current).filter_map(|t| s.tasks.get(t)) {
                new_tasks.push(wire::task_def(s, t)?);
            }
            Ok(pb::WorkerHeartbeatResponse {
                new_tasks,
                tasks_to_delete: current.difference(&assigned).copied().collect(),
                snapshot_tasks: Vec::new(),
            })
        })
    }

    pub async fn worker_update(
        &self,
        id: Option<RequestId>,
        req: pb::WorkerUpdateRequest,
    ) -> Result<(), CoordError> {
        let unknown = self
            .read(|s| {
                req.updates
                    .iter()
                    .map(|u| u.task_id)
                    .find(|t| !s.tasks.contains_key(t))
            })
            .await?;
        if let Some(t) = unknown {
            return Err(status(Code::NotFound, format!("Task {t} not found")));
        }
        let done: Vec<i64> = req
            .updates
            .iter()
            .filter(|u| u.completed)
            .map(|u| u.task_id)
            .collect();
        if done.is_empty() {
            return Ok(());
        }
        let op = DispatcherOp::FinishTasks {
            address: req.worker_address,
            tasks: done,
        };
        self.commit(id, op).await?;
        Ok(())
    }
}

/// Where a new worker stands in the configured worker list (TensorFlow's `WorkerIndexResolver`):
/// its own address, else the first `host:%port%` entry of its host no registered worker took.
/// `None` when no list is configured; an address the list does not allow is refused.
pub fn worker_index(
    configured: &[String],
    s: &DispatcherState,
    address: &str,
) -> Result<Option<WorkerIndex>, CoordError> {
    if configured.is_empty() {
        return Ok(None);
    }
    let of = i64::try_from(configured.len()).unwrap_or(i64::MAX);
    let taken: BTreeSet<i64> = s
        .workers
        .values()
        .filter_map(|w| w.index.map(|i| i.index))
        .collect();
    let at = |i: usize| {
        Some(WorkerIndex {
            index: i64::try_from(i).unwrap_or(i64::MAX),
            of,
        })
    };
    if let Some(i) = configured.iter().position(|c| c == address) {
        return Ok(at(i));
    }
    let free_port = configured.iter().enumerate().position(|(i, c)| {
        !taken.contains(&i64::try_from(i).unwrap_or(i64::MAX)) && matches_any_port(c, address)
    });
    match free_port {
        Some(i) => Ok(at(i)),
        None => Err(status(
            Code::FailedPrecondition,
            format!(
                "Failed to assign an index for worker {address}. Configured workers list: [{}]. \
                 The worker's address is not configured, or other workers are already running at \
                 the configured host. If your worker has restarted, make sure it runs at the same \
                 address and port.",
                configured.join(", ")
            ),
        )),
    }
}

/// `host:%port%` matches any port on `host`.
fn matches_any_port(configured: &str, address: &str) -> bool {
    let Some(host) = configured.strip_suffix(":%port%") else {
        return false;
    };
    address
        .rsplit_once(':')
        .is_some_and(|(h, port)| h == host && !port.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_raft_store::dispatcher::Worker;

    fn registered(s: &mut DispatcherState, address: &str, index: i64) {
        s.workers.insert(
            address.into(),
            Worker {
                transfer_servers: vec![],
                tags: vec![],
                uid: 0,
                index: Some(WorkerIndex { index, of: 3 }),
                tasks: Default::default(),
                lost: false,
                reports_delivery: false,
                registration: 1,
            },
        );
    }

    #[test]
    fn workers_get_their_place_in_the_configured_list() {
        let list: Vec<String> = ["a:1", "b:%port%", "b:%port%"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut s = DispatcherState::default();
        assert_eq!(worker_index(&[], &s, "x:1").expect("no list"), None);
        let at =
            |s: &DispatcherState, a: &str| worker_index(&list, s, a).map(|i| i.map(|i| i.index));
        assert_eq!(at(&s, "a:1").expect("a"), Some(0));
        assert_eq!(at(&s, "b:7").expect("b"), Some(1));
        registered(&mut s, "b:7", 1);
        assert_eq!(at(&s, "b:8").expect("b again"), Some(2));
        registered(&mut s, "b:8", 2);
        let refused = at(&s, "b:9").expect_err("no place left");
        assert!(refused.to_string().contains("b:9"), "{refused}");
        assert!(at(&s, "c:1").is_err());
    }
}

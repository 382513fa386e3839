//! The coordination service's semantics on the leader, written once for every wire surface:
//! tasks, heartbeats, errors, barriers, WaitForAllTasks and shutdown.
//!
//! Outcomes are decided by the state machine; this layer commits commands, answers heartbeats
//! from leader memory, and parks calls that must wait (barriers, error polls) until apply records
//! what they wait for. A parked call that loses its leader fails `LeaderChanged` and routing
//! re-drives it on the new leader, where the committed arrival is found again.
//!
//! [`CoordCore`] is here with the calls that answer at once (registration, heartbeats, errors,
//! task states, runs); the calls that wait, and how they park, are in `waits`, which builds on
//! this module and is not used by it; `arrivals` has the barrier arrivals a sidecar sends
//! together and the one wait it parks per instance.

mod arrivals;
mod waits;

use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::state::{
    Cluster, Code, DeviceInfo, ErrorEvent, TaskName, TaskRecord, TaskState,
};
use coord_raft_store::{Command, Op, OpError, Output, RequestId};

use crate::error::CoordError;
use crate::serve::apply_hub::ApplyHub;
use crate::serve::heartbeats::Heartbeats;
use crate::serve::namespace::{Ns, NsReader};
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;

pub struct CoordCore {
    pub proposer: Proposer,
    pub read_index: ReadIndex,
    /// Reads the namespace of the call.
    pub reader: NsReader,
    pub hub: Arc<ApplyHub>,
    pub heartbeats: Arc<Heartbeats>,
    /// Every task's devices of a namespace as of an applied log index: when WaitForAllTasks
    /// releases thousands of tasks at once they share one list instead of each walking every task
    /// record.
    pub devices: std::sync::Mutex<Option<DevicesAt>>,
    /// The last answer of WatchTasks (and WatchJobState): a job's task records at one task
    /// version. A change answers every watcher of the job's tasks at once: they share one list
    /// instead of each copying every task record (N watchers of N tasks), and the service
    /// encodes it once for all of them.
    pub watched: std::sync::Mutex<Option<WatchedAt>>,
}

/// A namespace's devices as of an applied log index.
pub type DevicesAt = ((Ns, u64), Arc<Vec<DeviceInfo>>);

/// A job's task records at one task version, in task order: WatchTasks' answer.
#[derive(Debug)]
pub struct JobTasks {
    pub version: i64,
    pub records: Vec<(TaskName, TaskRecord)>,
}

/// One [`JobTasks`], shared by every watcher of its version.
pub type Watched = Arc<JobTasks>;

/// The records of a job (namespace, service incarnation, task version, job) at that version.
pub type WatchedAt = ((Ns, u64, u64, String), Watched);

pub(super) fn unexpected(what: &str, out: &Output) -> CoordError {
    CoordError::Internal(format!("{what} returned {out:?}"))
}

impl CoordCore {
    /// Proposes `op` and waits until it is committed and applied; its output.
    ///
    /// Boxed: the proposal's future is over a KiB, and a call that parks after its commit (a
    /// barrier arrival) would otherwise carry room for it in its own future all the while it
    /// waits. Boxed, the room is given back once the commit is done.
    pub(super) fn commit(
        &self,
        request: Option<RequestId>,
        op: Op,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Output, CoordError>> + Send + '_>>
    {
        Box::pin(async move {
            let result = self.proposer.propose(Command { request, op }).await?;
            Ok(result?)
        })
    }

    /// Reads the cluster from this (leader) replica's applied state.
    pub(super) fn with_cluster<R>(&self, f: impl FnOnce(&Cluster) -> R) -> Result<R, CoordError> {
        self.reader.read(|a| match &a.state.cluster {
            Some(c) => Ok(f(c)),
            None => Err(OpError::NoCluster.into()),
        })
    }

    /// Registers the task, which says whether it is `recoverable` (TF sends it with every
    /// registration); returns the service incarnation.
    pub async fn register(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        incarnation: u64,
        recoverable: bool,
    ) -> Result<u64, CoordError> {
        let op = if recoverable {
            Op::RegisterRecoverableTask {
                task: task.clone(),
                incarnation,
            }
        } else {
            Op::RegisterTask {
                task: task.clone(),
                incarnation,
            }
        };
        // A registration counts as a heartbeat: the task has not had time to send one. Heard
        // before the commit too: the checker may see the task connected as soon as the
        // registration is applied, before this call resumes, and would measure its silence from
        // when this replica began to lead (a task that took longer than the heartbeat timeout to
        // start, as TensorFlow importing on a loaded machine, was put in error 10 ms after it
        // registered). Heard for a registration that then fails is harmless: only connected tasks
        // are checked.
        self.heard(&task, incarnation);
        match self.commit(id, op).await? {
            Output::Registered {
                service_incarnation,
            } => {
                self.heard(&task, incarnation);
                Ok(service_incarnation)
            }
            other => Err(unexpected("RegisterTask", &other)),
        }
    }

    /// Notes `task` heard from just now (a registration), with its namespace's heartbeat timeout.
    pub(super) fn heard(&self, task: &TaskName, incarnation: u64) {
        let timeout = self
            .with_cluster(|c| Duration::from_millis(c.config.heartbeat_timeout_ms))
            .unwrap_or_default();
        self.heartbeats.record(task, incarnation, timeout);
    }

    /// The cluster's service incarnation (the same on every replica, forever).
    pub fn service_incarnation(&self) -> Result<u64, CoordError> {
        self.with_cluster(|c| c.service_incarnation)
    }

    /// The first error `task` must learn of since it last registered, if it is connected and there
    /// is one, from this (leader) replica's applied state: a heartbeat's answer (TensorFlow's
    /// agents learn of other tasks' failures that way, see `api::tf`). Every heartbeat is
    /// answered with it until the task registers again: answered once only, TensorFlow 2.21's
    /// agent never acted on it (`tests/tests/tensorflow.rs::a_killed_worker_fails_the_others`).
    pub fn unseen_error(&self, task: &TaskName) -> Result<Option<ErrorEvent>, CoordError> {
        self.with_cluster(|c| {
            c.tasks
                .get(task)
                .filter(|r| r.state == TaskState::Connected)
                .and_then(|r| c.errors.next_for(task, r.errors_seen_at_register))
                .cloned()
        })
    }

    /// Answers a heartbeat from leader memory; returns the service incarnation. The task's state
    /// decides the answer: an error state is returned as the error.
    pub fn heartbeat(&self, task: &TaskName, incarnation: u64) -> Result<u64, CoordError> {
        let (service, heard, grace) = self.with_cluster(|c| {
            let Some(rec) = c.tasks.get(task) else {
                return Err(CoordError::status(Code::InvalidArgument, c.config.why_unknown(task)));
            };
            let grace = Duration::from_millis(c.config.heartbeat_timeout_ms);
            match rec.state {
                TaskState::Connected if rec.incarnation == incarnation => {
                    Ok((c.service_incarnation, true, grace))
                }
                TaskState::Connected => Err(CoordError::status(
                    Code::Aborted,
                    format!(
                        "heartbeat from task {task} with incarnation {incarnation:#x}, but it registered with {:#x}: it restarted and must register again",
                        rec.incarnation
                    ),
                )),
                // ABORTED, as TensorFlow's service answers a task in error.
                TaskState::Error => Err(CoordError::status(
                    Code::Aborted,
                    format!(
                        "unexpected heartbeat from task {task}, which is already in error: {}",
                        rec.error.as_ref().map_or("no error recorded", |e| e.message.as_str())
                    ),
                )),
                // A heartbeat already on its way when the task disconnected: accepted for one
                // heartbeat timeout, as TensorFlow's service does, and not counted as a sign of
                // life (the task stays disconnected).
                TaskState::Disconnected
                    if rec.incarnation == incarnation
                        && self.heartbeats.disconnected_within(task, grace) =>
                {
                    Ok((c.service_incarnation, false, grace))
                }
                // INVALID_ARGUMENT, as TensorFlow's service answers.
                TaskState::Disconnected => Err(CoordError::status(
                    Code::InvalidArgument,
                    format!("task {task} is not registered: it must register before sending heartbeats (a heartbeat before RegisterTask, or after ShutdownTask/ResetTask)"),
                )),
            }
        })??;
        if heard {
            self.heartbeats.record(task, incarnation, grace);
        }
        Ok(service)
    }

    pub async fn report_error(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        code: i32,
        message: String,
    ) -> Result<(), CoordError> {
        let op = Op::ReportError {
            task,
            code: Code::from_i32(code),
            message,
        };
        self.commit(id, op).await.map(|_| ())
    }

    pub async fn reset(&self, id: Option<RequestId>, task: TaskName) -> Result<(), CoordError> {
        self.commit(id, Op::ResetTask { task: task.clone() })
            .await?;
        self.heartbeats.disconnected(&task);
        Ok(())
    }

    pub async fn shutdown_service(
        &self,
        id: Option<RequestId>,
        reason: String,
    ) -> Result<(), CoordError> {
        self.commit(id, Op::ShutdownService { reason })
            .await
            .map(|_| ())
    }

    /// Ends the job's current run by hand (see `coord_raft_store::state::runs`); returns the run
    /// that began.
    pub async fn end_run(&self, id: Option<RequestId>, reason: String) -> Result<u64, CoordError> {
        self.commit(id, Op::EndRun { reason }).await?;
        Ok(self.reader.read(|a| a.state.runs.number))
    }

    /// The given tasks' records (all tasks if none given), linearizable; and the service
    /// incarnation.
    pub async fn task_states(
        &self,
        tasks: Vec<TaskName>,
    ) -> Result<(u64, Vec<(TaskName, TaskRecord)>), CoordError> {
        self.read_index.linearize().await?;
        self.with_cluster(|c| {
            let pick: Vec<TaskName> = if tasks.is_empty() {
                c.config.all_tasks().collect()
            } else {
                tasks
            };
            let mut out = Vec::with_capacity(pick.len());
            for t in pick {
                match c.tasks.get(&t) {
                    Some(r) => out.push((t, r.clone())),
                    None => {
                        return Err(CoordError::status(
                            Code::InvalidArgument,
                            c.config.why_unknown(&t),
                        ))
                    }
                }
            }
            Ok((c.service_incarnation, out))
        })?
    }
}

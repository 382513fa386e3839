//! The coordination service's semantics on the leader, written once for every wire surface:
//! tasks, heartbeats, errors, barriers, WaitForAllTasks and shutdown.
//!
//! Outcomes are decided by the state machine; this layer commits commands, answers heartbeats
//! from leader memory, and parks calls that must wait (barriers, error polls) until apply records
//! what they wait for. A parked call that loses its leader fails `LeaderChanged` and routing
//! re-drives it on the new leader, where the committed arrival is found again.

use std::sync::Arc;

use coord_raft_store::state::{
    Cluster, Code, DeviceInfo, ErrorEvent, Outcome, TaskName, TaskRecord, TaskState,
    SHUTDOWN_BARRIER, WAIT_FOR_ALL_TASKS_BARRIER,
};
use coord_raft_store::storage::StateReader;
use coord_raft_store::{Command, Op, OpError, Output, RequestId};

use crate::apply_hub::ApplyHub;
use crate::error::CoordError;
use crate::heartbeats::Heartbeats;
use crate::parked::Wake;
use crate::proposer::Proposer;
use crate::read_index::ReadIndex;

pub struct CoordCore {
    pub proposer: Proposer,
    pub read_index: ReadIndex,
    pub reader: StateReader,
    pub hub: Arc<ApplyHub>,
    pub heartbeats: Arc<Heartbeats>,
    /// Every task's devices as of an applied log index: when WaitForAllTasks releases thousands of
    /// tasks at once they share one list instead of each walking every task record.
    pub devices: std::sync::Mutex<Option<(u64, Arc<Vec<DeviceInfo>>)>>,
}

fn op_status(code: Code, message: String) -> CoordError {
    CoordError::Op(OpError::Status { code, message })
}

fn unexpected(what: &str, out: &Output) -> CoordError {
    CoordError::Internal(format!("{what} returned {out:?}"))
}

impl CoordCore {
    async fn commit(&self, request: Option<RequestId>, op: Op) -> Result<Output, CoordError> {
        let result = self.proposer.propose(Command { request, op }).await?;
        Ok(result?)
    }

    /// Reads the cluster from this (leader) replica's applied state.
    fn with_cluster<R>(&self, f: impl FnOnce(&Cluster) -> R) -> Result<R, CoordError> {
        self.reader.read(|a| match &a.state.cluster {
            Some(c) => Ok(f(c)),
            None => Err(OpError::NoCluster.into()),
        })
    }

    /// Registers the task; returns the service incarnation.
    pub async fn register(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        incarnation: u64,
    ) -> Result<u64, CoordError> {
        let op = Op::RegisterTask {
            task: task.clone(),
            incarnation,
        };
        match self.commit(id, op).await? {
            Output::Registered {
                service_incarnation,
            } => {
                // A registration counts as a heartbeat: the task has not had time to send one.
                self.heartbeats.record(&task, incarnation);
                Ok(service_incarnation)
            }
            other => Err(unexpected("RegisterTask", &other)),
        }
    }

    /// Answers a heartbeat from leader memory; returns the service incarnation. The task's state
    /// decides the answer: an error state is returned as the error.
    pub fn heartbeat(&self, task: &TaskName, incarnation: u64) -> Result<u64, CoordError> {
        let outcome = self.with_cluster(|c| {
            let Some(rec) = c.tasks.get(task) else {
                return Err(op_status(Code::InvalidArgument, c.config.why_unknown(task)));
            };
            match rec.state {
                TaskState::Connected if rec.incarnation == incarnation => Ok(c.service_incarnation),
                TaskState::Connected => Err(op_status(
                    Code::Aborted,
                    format!(
                        "heartbeat from task {task} with incarnation {incarnation:#x}, but it registered with {:#x}: it restarted and must register again",
                        rec.incarnation
                    ),
                )),
                TaskState::Error => Err(task_error(task, rec)),
                TaskState::Disconnected => Err(op_status(
                    Code::FailedPrecondition,
                    format!("task {task} is not registered (heartbeat before RegisterTask, or after ShutdownTask/ResetTask)"),
                )),
            }
        })??;
        self.heartbeats.record(task, incarnation);
        Ok(outcome)
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
        self.commit(id, Op::ResetTask { task }).await.map(|_| ())
    }

    /// Disconnects the task; with a shutdown barrier configured, waits until every task is shutting
    /// down (or the barrier fails) and returns the barrier's outcome.
    pub async fn shutdown(
        &self,
        id: Option<RequestId>,
        task: TaskName,
    ) -> Result<Option<Outcome>, CoordError> {
        let epoch = self.hub.barriers.epoch();
        match self.commit(id, Op::ShutdownTask { task }).await? {
            Output::Done => Ok(None),
            Output::Barrier { counter, outcome } => match outcome {
                Some(o) => Ok(Some(o)),
                None => self
                    .await_barrier(SHUTDOWN_BARRIER, counter, epoch)
                    .await
                    .map(Some),
            },
            other => Err(unexpected("ShutdownTask", &other)),
        }
    }

    /// Records the task's devices and waits until every task has called WaitForAllTasks; returns
    /// the service incarnation and every task's devices in task order.
    pub async fn wait_for_all(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        devices: DeviceInfo,
    ) -> Result<(u64, Arc<Vec<DeviceInfo>>), CoordError> {
        let epoch = self.hub.barriers.epoch();
        let outcome = match self
            .commit(id, Op::WaitForAllTasks { task, devices })
            .await?
        {
            Output::Barrier {
                outcome: Some(o), ..
            } => o,
            Output::Barrier {
                counter,
                outcome: None,
            } => {
                self.await_barrier(WAIT_FOR_ALL_TASKS_BARRIER, counter, epoch)
                    .await?
            }
            other => return Err(unexpected("WaitForAllTasks", &other)),
        };
        if let Outcome::Failed { code, message } = outcome {
            return Err(op_status(code, message));
        }
        self.reader.read(|a| {
            let c = a
                .state
                .cluster
                .as_ref()
                .ok_or(CoordError::from(OpError::NoCluster))?;
            let at = a.last_applied.map_or(0, |l| l.index);
            let mut cache = self
                .devices
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let all = match cache.as_ref() {
                Some((index, all)) if *index == at => all.clone(),
                _ => {
                    let all: Arc<Vec<DeviceInfo>> = Arc::new(
                        c.tasks
                            .iter()
                            .filter_map(|(_, r)| r.devices.clone())
                            .collect(),
                    );
                    *cache = Some((at, all.clone()));
                    all
                }
            };
            Ok((c.service_incarnation, all))
        })
    }

    /// Waits at the barrier; returns the instance's counter when it passes.
    #[allow(clippy::too_many_arguments)]
    pub async fn barrier(
        &self,
        id: Option<RequestId>,
        barrier: String,
        counter: i64,
        tasks: Vec<TaskName>,
        timeout_ms: i64,
        source: TaskName,
    ) -> Result<i64, CoordError> {
        let epoch = self.hub.barriers.epoch();
        let op = Op::Barrier {
            id: barrier.clone(),
            counter,
            tasks,
            timeout_ms,
            source,
        };
        let (counter, outcome) = match self.commit(id, op).await? {
            Output::Barrier {
                counter,
                outcome: Some(o),
            } => (counter, o),
            Output::Barrier {
                counter,
                outcome: None,
            } => (counter, self.await_barrier(&barrier, counter, epoch).await?),
            other => return Err(unexpected("Barrier", &other)),
        };
        match outcome {
            Outcome::Passed => Ok(counter),
            Outcome::Failed { code, message } => Err(op_status(code, message)),
        }
    }

    pub async fn cancel_barrier(
        &self,
        id: Option<RequestId>,
        barrier: String,
        counter: i64,
        source: TaskName,
    ) -> Result<(), CoordError> {
        let op = Op::CancelBarrier {
            id: barrier,
            counter,
            source,
        };
        self.commit(id, op).await.map(|_| ())
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

    /// Parks until instance `counter` of `barrier` has an outcome.
    async fn await_barrier(
        &self,
        barrier: &str,
        counter: i64,
        epoch: u64,
    ) -> Result<Outcome, CoordError> {
        let key = (barrier.to_string(), counter);
        loop {
            let found = self.reader.read(|a| {
                let outcome = a
                    .state
                    .cluster
                    .as_ref()
                    .and_then(|c| c.barriers.get(barrier))
                    .and_then(|b| b.outcome_of(counter).cloned());
                match outcome {
                    Some(o) => Ok(o),
                    None => Err(self.hub.barriers.park(&key, epoch)),
                }
            });
            let mut parked = match found {
                Ok(o) => return Ok(o),
                Err(Some(p)) => p,
                Err(None) => return Err(CoordError::LeaderChanged),
            };
            match parked.wait().await {
                Wake::Changed(()) | Wake::Recheck => continue,
                Wake::LeaderLost => return Err(CoordError::LeaderChanged),
            }
        }
    }

    /// Waits for the first error after `after` that `task` must learn of.
    pub async fn poll_error(&self, task: TaskName, after: u64) -> Result<ErrorEvent, CoordError> {
        let epoch = self.hub.errors.epoch();
        self.read_index.linearize().await?;
        self.with_cluster(|c| {
            if c.config.contains(&task) {
                Ok(())
            } else {
                Err(op_status(
                    Code::InvalidArgument,
                    c.config.why_unknown(&task),
                ))
            }
        })??;
        loop {
            let found = self.reader.read(|a| {
                let event = a
                    .state
                    .cluster
                    .as_ref()
                    .and_then(|c| c.errors.next_for(&task, after).cloned());
                match event {
                    Some(e) => Ok(e),
                    None => Err(self.hub.errors.park(&(), epoch)),
                }
            });
            let mut parked = match found {
                Ok(e) => return Ok(e),
                Err(Some(p)) => p,
                Err(None) => return Err(CoordError::LeaderChanged),
            };
            match parked.wait().await {
                Wake::Changed(_) | Wake::Recheck => continue,
                Wake::LeaderLost => return Err(CoordError::LeaderChanged),
            }
        }
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
                    None => return Err(op_status(Code::InvalidArgument, c.config.why_unknown(&t))),
                }
            }
            Ok((c.service_incarnation, out))
        })?
    }
}

/// The error a task in ERROR state is answered with.
fn task_error(task: &TaskName, rec: &TaskRecord) -> CoordError {
    match &rec.error {
        Some(e) => op_status(
            e.code,
            format!("task {task} is in error state: {}", e.message),
        ),
        None => op_status(Code::Internal, format!("task {task} is in error state")),
    }
}

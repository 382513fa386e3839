//! The coordination service's semantics on the leader, written once for every wire surface:
//! tasks, heartbeats, errors, barriers, WaitForAllTasks and shutdown.
//!
//! Outcomes are decided by the state machine; this layer commits commands, answers heartbeats
//! from leader memory, and parks calls that must wait (barriers, error polls) until apply records
//! what they wait for. A parked call that loses its leader fails `LeaderChanged` and routing
//! re-drives it on the new leader, where the committed arrival is found again.

use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::state::{
    alive_set_key, alive_wait_key, AliveAnswer, Cluster, Code, DeviceInfo, ErrorEvent, Outcome,
    TaskName, TaskRecord, TaskState, REGISTER_BARRIER, SHUTDOWN_BARRIER,
    WAIT_FOR_ALL_TASKS_BARRIER,
};
use coord_raft_store::storage::{Applied, StateReader};
use coord_raft_store::{Command, Op, OpError, Output, RequestId};

use crate::error::CoordError;
use crate::serve::apply_hub::ApplyHub;
use crate::serve::heartbeats::Heartbeats;
use crate::serve::parked::{Slot, WaitRegistry, Wake};
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;

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

    /// Registers the task and waits until every one of `participants` registered (XLA's register
    /// barrier); returns the service incarnation.
    pub async fn register_at_barrier(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        incarnation: u64,
        participants: Vec<TaskName>,
    ) -> Result<u64, CoordError> {
        let (epoch, slot) =
            self.barrier_slot(|| format!("RegisterTask of {task} at the register barrier"))?;
        let op = Op::RegisterAtBarrier {
            task: task.clone(),
            incarnation,
            participants,
        };
        let outcome = match self.commit(id, op).await? {
            Output::Barrier {
                outcome: Some(o), ..
            } => o,
            Output::Barrier {
                counter,
                outcome: None,
            } => {
                // Registered: it counts as a heartbeat while the others arrive.
                self.heartbeats.record(&task, incarnation);
                self.await_barrier(REGISTER_BARRIER, counter, epoch, slot)
                    .await?
            }
            other => return Err(unexpected("RegisterAtBarrier", &other)),
        };
        if let Outcome::Failed { code, message } = outcome {
            return Err(CoordError::status(code, message));
        }
        self.heartbeats.record(&task, incarnation);
        self.service_incarnation()
    }

    /// The cluster's service incarnation (the same on every replica, forever).
    pub fn service_incarnation(&self) -> Result<u64, CoordError> {
        self.with_cluster(|c| c.service_incarnation)
    }

    /// XLA's GetAliveTasks: waits until every live task of `tasks` asked; returns the live ones
    /// with their incarnations.
    pub async fn get_alive(
        &self,
        id: Option<RequestId>,
        source: TaskName,
        tasks: Vec<TaskName>,
    ) -> Result<AliveAnswer, CoordError> {
        let (epoch, slot) = self.barrier_slot(|| format!("GetAliveTasks of {source}"))?;
        let set = alive_set_key(&tasks);
        let generation = match self.commit(id, Op::GetAliveTasks { source, tasks }).await? {
            Output::Alive {
                answer: Some(a), ..
            } => return Ok(a),
            Output::Alive {
                generation,
                answer: None,
            } => generation,
            other => return Err(unexpected("GetAliveTasks", &other)),
        };
        let key = (alive_wait_key(&set), generation as i64);
        let run = self.reader.read(|a| a.state.runs.current());
        self.park_until(
            &self.hub.barriers,
            &key,
            epoch,
            Some(slot),
            String::new,
            |a| {
                if a.state.runs.current() != run {
                    return Some(Err(CoordError::status(
                        Code::Aborted,
                        format!("GetAliveTasks ended with run {run} of the job"),
                    )));
                }
                let c = a.state.cluster.as_ref()?;
                c.alive.answer(&set, generation).cloned().map(Ok)
            },
        )
        .await?
    }

    /// XLA's WatchTasks: the records of `tasks` and the task version, at once if `version`
    /// differs from the current one, else after the next change.
    pub async fn watch_tasks(
        &self,
        tasks: &[TaskName],
        version: i64,
    ) -> Result<(i64, Vec<(TaskName, TaskRecord)>), CoordError> {
        let epoch = self.hub.tasks.epoch();
        self.read_index.linearize().await?;
        self.park_until(
            &self.hub.tasks,
            &(),
            epoch,
            None,
            || "WatchTasks".to_string(),
            |a| {
                let Some(c) = a.state.cluster.as_ref() else {
                    return Some(Err(CoordError::from(OpError::NoCluster)));
                };
                let current = c.task_version as i64;
                (current != version).then(|| {
                    let records = tasks
                        .iter()
                        .filter_map(|t| c.tasks.get(t).map(|r| (t.clone(), r.clone())))
                        .collect();
                    Ok((current, records))
                })
            },
        )
        .await?
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

    /// Every task of `job` (none for a job the cluster does not have, as TensorFlow answers).
    pub fn tasks_of_job(&self, job: &str) -> Result<Vec<TaskName>, CoordError> {
        self.with_cluster(|c| c.config.all_tasks().filter(|t| t.job == job).collect())
    }

    /// XLA's PollForError: the first error `task` must learn of since it last registered.
    pub async fn poll_error_since_register(
        &self,
        task: TaskName,
    ) -> Result<ErrorEvent, CoordError> {
        self.read_index.linearize().await?;
        let after = self.with_cluster(|c| match c.tasks.get(&task) {
            None => Err(CoordError::status(
                Code::InvalidArgument,
                c.config.why_unknown(&task),
            )),
            Some(r) if r.state == TaskState::Disconnected => Err(CoordError::status(
                Code::FailedPrecondition,
                format!("task {task} polls for errors but is not registered"),
            )),
            Some(r) => Ok(r.errors_seen_at_register),
        })??;
        self.poll_error(task, after).await
    }

    /// Answers a heartbeat from leader memory; returns the service incarnation. The task's state
    /// decides the answer: an error state is returned as the error.
    pub fn heartbeat(&self, task: &TaskName, incarnation: u64) -> Result<u64, CoordError> {
        let (service, heard) = self.with_cluster(|c| {
            let Some(rec) = c.tasks.get(task) else {
                return Err(CoordError::status(Code::InvalidArgument, c.config.why_unknown(task)));
            };
            let grace = Duration::from_millis(c.config.heartbeat_timeout_ms);
            match rec.state {
                TaskState::Connected if rec.incarnation == incarnation => {
                    Ok((c.service_incarnation, true))
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
                    Ok((c.service_incarnation, false))
                }
                // INVALID_ARGUMENT, as TensorFlow's service answers.
                TaskState::Disconnected => Err(CoordError::status(
                    Code::InvalidArgument,
                    format!("task {task} is not registered: it must register before sending heartbeats (a heartbeat before RegisterTask, or after ShutdownTask/ResetTask)"),
                )),
            }
        })??;
        if heard {
            self.heartbeats.record(task, incarnation);
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

    /// Disconnects the task; with a shutdown barrier configured, waits until every task is shutting
    /// down (or the barrier fails) and returns the barrier's outcome.
    pub async fn shutdown(
        &self,
        id: Option<RequestId>,
        task: TaskName,
    ) -> Result<Option<Outcome>, CoordError> {
        let (epoch, slot) = self.barrier_slot(|| format!("ShutdownTask of {task}"))?;
        let outcome = match self
            .commit(id, Op::ShutdownTask { task: task.clone() })
            .await?
        {
            Output::Done => None,
            Output::Barrier { counter, outcome } => match outcome {
                Some(o) => Some(o),
                None => Some(
                    self.await_barrier(SHUTDOWN_BARRIER, counter, epoch, slot)
                        .await?,
                ),
            },
            other => return Err(unexpected("ShutdownTask", &other)),
        };
        self.heartbeats.disconnected(&task);
        Ok(outcome)
    }

    /// Records the task's devices and waits until every task has called WaitForAllTasks; returns
    /// the service incarnation and every task's devices in task order.
    pub async fn wait_for_all(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        devices: DeviceInfo,
    ) -> Result<(u64, Arc<Vec<DeviceInfo>>), CoordError> {
        let (epoch, slot) = self.barrier_slot(|| format!("WaitForAllTasks of {task}"))?;
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
                self.await_barrier(WAIT_FOR_ALL_TASKS_BARRIER, counter, epoch, slot)
                    .await?
            }
            other => return Err(unexpected("WaitForAllTasks", &other)),
        };
        if let Outcome::Failed { code, message } = outcome {
            return Err(CoordError::status(code, message));
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
        let (epoch, slot) =
            self.barrier_slot(|| format!("the wait of {source} at barrier {barrier:?}"))?;
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
            } => (
                counter,
                self.await_barrier(&barrier, counter, epoch, slot).await?,
            ),
            other => return Err(unexpected("Barrier", &other)),
        };
        match outcome {
            Outcome::Passed => Ok(counter),
            Outcome::Failed { code, message } => Err(CoordError::status(code, message)),
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

    /// Ends the job's current run by hand (see `coord_raft_store::state::runs`); returns the run
    /// that began.
    pub async fn end_run(&self, id: Option<RequestId>, reason: String) -> Result<u64, CoordError> {
        self.commit(id, Op::EndRun { reason }).await?;
        Ok(self.reader.read(|a| a.state.runs.number))
    }

    /// The leadership epoch and a park slot for a call that may wait at a barrier, taken before
    /// its arrival is committed: a call the park budget refuses changes nothing.
    fn barrier_slot(&self, what: impl FnOnce() -> String) -> Result<(u64, Slot), CoordError> {
        let epoch = self.hub.barriers.epoch();
        match self.hub.budget.take() {
            Some(slot) => Ok((epoch, slot)),
            None => Err(self.hub.budget.refusal(&what())),
        }
    }

    /// Parks until instance `counter` of `barrier` has an outcome, on the caller's slot.
    async fn await_barrier(
        &self,
        barrier: &str,
        counter: i64,
        epoch: u64,
        slot: Slot,
    ) -> Result<Outcome, CoordError> {
        let key = (barrier.to_string(), counter);
        // A new run of the job clears every instance of the last: a call still waiting on one
        // is told its run ended.
        let run = self.reader.read(|a| a.state.runs.current());
        self.park_until(
            &self.hub.barriers,
            &key,
            epoch,
            Some(slot),
            String::new,
            |a| {
                if a.state.runs.current() != run {
                    return Some(Outcome::Failed {
                        code: Code::Aborted,
                        message: format!(
                            "barrier {barrier:?} #{counter} ended with run {run} of the job"
                        ),
                    });
                }
                let c = a.state.cluster.as_ref()?;
                c.barriers.get(barrier)?.outcome_of(counter).cloned()
            },
        )
        .await
    }

    /// Parks on `key` of `registry` until `check` finds what the caller waits for in the applied
    /// state (it is asked again at every wake). A caller without a `slot` takes one from the park
    /// budget when it first parks; `what` names the call if the budget refuses it. Losing leadership ends the wait with
    /// `LeaderChanged`, so that routing drives the call again on the new leader.
    async fn park_until<K, V, R>(
        &self,
        registry: &Arc<WaitRegistry<K, V>>,
        key: &K,
        epoch: u64,
        mut slot: Option<Slot>,
        what: impl FnOnce() -> String,
        check: impl Fn(&Applied) -> Option<R>,
    ) -> Result<R, CoordError>
    where
        K: Hash + Eq + Clone,
        V: Clone,
    {
        loop {
            let found = self.reader.read(|a| match check(a) {
                Some(r) => Ok(r),
                None => Err(registry.park(key, epoch, &mut slot)),
            });
            let mut parked = match found {
                Ok(r) => return Ok(r),
                Err(Ok(p)) => p,
                Err(Err(why)) => return Err(registry.not_parked(why, what)),
            };
            match parked.wait().await {
                Wake::Changed(_) | Wake::Recheck => continue,
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
                Err(CoordError::status(
                    Code::InvalidArgument,
                    c.config.why_unknown(&task),
                ))
            }
        })??;
        self.park_until(
            &self.hub.errors,
            &(),
            epoch,
            None,
            || format!("PollForError of {task}"),
            |a| {
                let c = a.state.cluster.as_ref()?;
                c.errors.next_for(&task, after).cloned()
            },
        )
        .await
    }

    /// The barrier instances still waiting for participants, linearizable: (record, missing).
    pub async fn open_barriers(
        &self,
    ) -> Result<Vec<(coord_raft_store::state::BarrierRecord, Vec<TaskName>)>, CoordError> {
        self.read_index.linearize().await?;
        self.with_cluster(|c| {
            c.barriers
                .pending()
                .map(|b| (b.clone(), b.missing(&c.config).collect()))
                .collect()
        })
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

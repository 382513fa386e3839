//! The coordination calls that wait on the leader: barriers (a job's own, and the three the
//! service holds itself: the register barrier, WaitForAllTasks and the shutdown barrier),
//! GetAliveTasks, WatchTasks and error polls; and how a call parks.
//!
//! A call takes its park slot and the leadership epoch before its arrival is committed, so a call
//! the park budget refuses changes nothing; it then parks until apply records what it waits for.
//! Losing leadership ends the wait with `LeaderChanged`, and routing drives the call again on the
//! new leader, where the committed arrival is found again. A new run of the job ends every wait
//! of the last (`ABORTED`).

use std::hash::Hash;
use std::sync::Arc;

use futures::future::Either;

use coord_raft_store::state::{
    alive_wait_key, AliveAnswer, Cluster, Code, DeviceInfo, ErrorEvent, Outcome, TaskName, TaskSet,
    TaskState, REGISTER_BARRIER, SHUTDOWN_BARRIER, WAIT_FOR_ALL_TASKS_BARRIER,
};
use coord_raft_store::{Op, OpError, Output, RequestId};

use super::{unexpected, CoordCore, DevicesAt, JobTasks, Watched};
use crate::error::CoordError;
use crate::serve::namespace::{self, Ns, View};
use crate::serve::parked::{Slot, WaitRegistry, Wake};

impl CoordCore {
    /// Registers the task and waits until every one of `participants` registered (XLA's register
    /// barrier); returns the service incarnation.
    ///
    /// Not an `async fn`, as [`Self::barrier`]: the registration is built into its commit before
    /// the future is, and a parked registration keeps what the wait needs, not the commit.
    pub fn register_at_barrier(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        incarnation: u64,
        participants: TaskSet,
    ) -> impl std::future::Future<Output = Result<u64, CoordError>> + '_ {
        let (epoch, slot) =
            match self.barrier_slot(|| format!("RegisterTask of {task} at the register barrier")) {
                Ok(taken) => taken,
                Err(e) => return Either::Left(std::future::ready(Err(e))),
            };
        let op = Op::RegisterAtBarrierOf {
            task: task.clone(),
            incarnation,
            participants,
        };
        // Heard before the commit, as in `register_task`: the heartbeat checker may see the task
        // connected before this call resumes.
        self.heard(&task, incarnation);
        let registration = self.commit(id, op);
        Either::Right(async move {
            // Done with the commit and its output before the park (see `barrier`).
            let (counter, decided) = match registration.await? {
                Output::Barrier { counter, outcome } => (counter, outcome),
                other => return Err(unexpected("RegisterAtBarrier", &other)),
            };
            let outcome = match decided {
                Some(o) => o,
                None => {
                    // Registered: it counts as a heartbeat while the others arrive.
                    self.heard(&task, incarnation);
                    self.await_barrier(REGISTER_BARRIER, counter, epoch, slot)
                        .await?
                }
            };
            if let Outcome::Failed { code, message } = outcome {
                return Err(CoordError::status(code, message));
            }
            self.heard(&task, incarnation);
            self.service_incarnation()
        })
    }

    /// XLA's GetAliveTasks: waits until every live task of `set` asked; returns the live ones
    /// with their incarnations (one answer every asker shares).
    pub async fn get_alive(
        &self,
        id: Option<RequestId>,
        source: TaskName,
        set: TaskSet,
    ) -> Result<AliveAnswer, CoordError> {
        let (epoch, slot) = self.barrier_slot(|| format!("GetAliveTasks of {source}"))?;
        let key = alive_wait_key(&set);
        let op = Op::GetAliveTasksOf {
            source,
            tasks: set.clone(),
        };
        let generation = match self.commit(id, op).await? {
            Output::Alive {
                answer: Some(a), ..
            } => return Ok(a),
            Output::Alive {
                generation,
                answer: None,
            } => generation,
            other => return Err(unexpected("GetAliveTasks", &other)),
        };
        self.park_alive(key, set, generation, epoch, slot).await
    }

    /// Waits until round `generation` of GetAliveTasks over `set` finishes (one that has not
    /// started yet is waited for); its answer. A round finished so long ago that its answer is no
    /// longer kept is FAILED_PRECONDITION: no wait could end.
    pub async fn await_alive(
        &self,
        set: TaskSet,
        generation: u64,
    ) -> Result<AliveAnswer, CoordError> {
        let (epoch, slot) = self
            .barrier_slot(|| format!("AwaitAlive of round {generation} of {} tasks", set.len()))?;
        self.read_index.linearize().await?;
        self.with_cluster(|c| {
            let now = c.alive.generation(&set);
            if generation < now && c.alive.answer(&set, generation).is_none() {
                return Err(CoordError::status(
                    Code::FailedPrecondition,
                    format!(
                        "GetAliveTasks of {} tasks: round {generation} finished long ago and its \
                         answer is no longer kept (the set is at round {now})",
                        set.len()
                    ),
                ));
            }
            Ok(())
        })??;
        self.park_alive(alive_wait_key(&set), set, generation, epoch, slot)
            .await
    }

    /// Parks on `slot` until round `generation` of `set` (parked under `key`) has its answer; a
    /// new run of the job ends the wait (`ABORTED`).
    async fn park_alive(
        &self,
        key: String,
        set: TaskSet,
        generation: u64,
        epoch: u64,
        slot: Slot,
    ) -> Result<AliveAnswer, CoordError> {
        let key = (key, generation as i64);
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

    /// XLA's WatchTasks (TF's WatchJobState): the records of `job`'s tasks (none for a job the
    /// cluster does not have, as TensorFlow answers) and the task version, at once if `version`
    /// differs from the current one, else after the next change. Every watcher of a version
    /// shares one list of the records (see [`CoordCore::watched`]).
    pub async fn watch_tasks(&self, job: &str, version: i64) -> Result<Watched, CoordError> {
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
                (current != version).then(|| Ok(self.watched_records(c, job)))
            },
        )
        .await?
    }

    /// `job`'s task records in `c` at its task version: the list the last watcher of that
    /// version took, or built (one walk of the job's records) for every watcher of it.
    fn watched_records(&self, c: &Cluster, job: &str) -> Watched {
        let at = (
            namespace::current(),
            c.service_incarnation,
            c.task_version,
            job.to_string(),
        );
        let mut kept = self
            .watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match kept.as_ref() {
            Some((k, records)) if *k == at => records.clone(),
            _ => {
                let records: Watched = Arc::new(JobTasks {
                    version: c.task_version as i64,
                    records: c
                        .tasks
                        .of_job(job)
                        .map(|(t, r)| (t.clone(), r.clone()))
                        .collect(),
                });
                *kept = Some((at, records.clone()));
                records
            }
        }
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

    /// Disconnects the task; with a shutdown barrier configured, waits until every task is shutting
    /// down (or the barrier fails) and returns the barrier's outcome.
    pub async fn shutdown(
        &self,
        id: Option<RequestId>,
        task: TaskName,
    ) -> Result<Option<Outcome>, CoordError> {
        let (epoch, slot) = self.barrier_slot(|| format!("ShutdownTask of {task}"))?;
        // Done with the commit and its output before the park (see `barrier`).
        let (counter, decided) = match self
            .commit(id, Op::ShutdownTask { task: task.clone() })
            .await?
        {
            Output::Done => (None, None),
            Output::Barrier { counter, outcome } => (Some(counter), outcome),
            other => return Err(unexpected("ShutdownTask", &other)),
        };
        let outcome = match (counter, decided) {
            (_, Some(o)) => Some(o),
            (Some(counter), None) => Some(
                self.await_barrier(SHUTDOWN_BARRIER, counter, epoch, slot)
                    .await?,
            ),
            (None, None) => None,
        };
        self.heartbeats.disconnected(&task);
        Ok(outcome)
    }

    /// Records the task's devices and waits until every task has called WaitForAllTasks; returns
    /// the service incarnation and every task's devices in task order.
    ///
    /// Not an `async fn`, as [`Self::barrier`]: the task's arrival is built into its commit
    /// before the future is.
    pub fn wait_for_all(
        &self,
        id: Option<RequestId>,
        task: TaskName,
        devices: DeviceInfo,
    ) -> impl std::future::Future<Output = Result<(u64, Arc<Vec<DeviceInfo>>), CoordError>> + '_
    {
        let (epoch, slot) = match self.barrier_slot(|| format!("WaitForAllTasks of {task}")) {
            Ok(taken) => taken,
            Err(e) => return Either::Left(std::future::ready(Err(e))),
        };
        let arrival = self.commit(id, Op::WaitForAllTasks { task, devices });
        Either::Right(async move {
            // Done with the commit and its output before the park (see `barrier`).
            let (counter, decided) = match arrival.await? {
                Output::Barrier { counter, outcome } => (counter, outcome),
                other => return Err(unexpected("WaitForAllTasks", &other)),
            };
            let outcome = match decided {
                Some(o) => o,
                None => {
                    self.await_barrier(WAIT_FOR_ALL_TASKS_BARRIER, counter, epoch, slot)
                        .await?
                }
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
                let at = (
                    namespace::current(),
                    a.applied.last_applied.map_or(0, |l| l.index),
                );
                let mut cache = self
                    .devices
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let all = match cache.as_ref() {
                    Some((index, all)) if *index == at => all.clone(),
                    kept => {
                        let fresh: Vec<DeviceInfo> = c
                            .tasks
                            .iter()
                            .filter_map(|(_, r)| r.devices.clone())
                            .collect();
                        let all = same_devices(kept, &at.0, fresh);
                        *cache = Some((at, all.clone()));
                        all
                    }
                };
                Ok((c.service_incarnation, all))
            })
        })
    }

    /// Waits at the barrier; returns the instance's counter when it passes. `named` is the
    /// arriving task and the barrier's participants as the call named them, or why they could not
    /// be read (the call's answer then).
    ///
    /// Not an `async fn`: one keeps its arguments beside the copies its body makes. Here the
    /// arrival is built into its (boxed) commit before the future is, so a parked call's future
    /// holds only the commit's box and what the wait needs.
    pub fn barrier(
        &self,
        id: Option<RequestId>,
        barrier: String,
        counter: i64,
        timeout_ms: i64,
        named: Result<(TaskName, Vec<TaskName>), CoordError>,
    ) -> impl std::future::Future<Output = Result<i64, CoordError>> + '_ {
        let (source, tasks) = match named {
            Ok(named) => named,
            Err(e) => return Either::Left(std::future::ready(Err(e))),
        };
        let (epoch, slot) =
            match self.barrier_slot(|| format!("the wait of {source} at barrier {barrier:?}")) {
                Ok(taken) => taken,
                Err(e) => return Either::Left(std::future::ready(Err(e))),
            };
        let arrival = self.commit(
            id,
            Op::Barrier {
                id: barrier.clone(),
                counter,
                tasks,
                timeout_ms,
                source,
            },
        );
        Either::Right(async move {
            // The commit and its output are done with before the park: a future or a value the
            // park's `match` arm sat in would live on beside it, in every parked call.
            let (counter, decided) = match arrival.await? {
                Output::Barrier { counter, outcome } => (counter, outcome),
                other => return Err(unexpected("Barrier", &other)),
            };
            let outcome = match decided {
                Some(o) => o,
                None => self.await_barrier(&barrier, counter, epoch, slot).await?,
            };
            match outcome {
                Outcome::Passed => Ok(counter),
                Outcome::Failed { code, message } => Err(CoordError::status(code, message)),
            }
        })
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

    /// The leadership epoch and a park slot for a call that may wait at a barrier, taken before
    /// its arrival is committed: a call the park budget refuses changes nothing.
    pub(super) fn barrier_slot(
        &self,
        what: impl FnOnce() -> String,
    ) -> Result<(u64, Slot), CoordError> {
        let epoch = self.hub.barriers.epoch();
        match self.hub.budget.take() {
            Some(slot) => Ok((epoch, slot)),
            None => Err(self.hub.budget.refusal(&what())),
        }
    }

    /// Parks until instance `counter` of `barrier` has an outcome, on the caller's slot.
    pub(super) async fn await_barrier(
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
        check: impl Fn(View<'_>) -> Option<R>,
    ) -> Result<R, CoordError>
    where
        K: Hash + Eq + Clone,
        V: Clone,
    {
        loop {
            // Matched in the statement that reads it: bound to a local, the reading would be
            // kept beside the park in every parked call.
            let mut parked = match self.reader.read(|a| match check(a) {
                Some(r) => Ok(r),
                None => Err(registry.park(key, epoch, &mut slot)),
            }) {
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
}

/// `fresh`, the namespace `ns`'s devices read at a later index than `kept` was, as the kept list
/// if that is the same namespace's and equal. Every entry applied moves the index (a follower's
/// arrival sent again, a registration elsewhere), while the devices change only as tasks arrive:
/// the answers of one gathering then stay one list, which the service encodes and compresses once
/// for all its callers (see `api::tf::TfService::device_fields`), however late each is polled.
fn same_devices(kept: Option<&DevicesAt>, ns: &Ns, fresh: Vec<DeviceInfo>) -> Arc<Vec<DeviceInfo>> {
    match kept {
        Some(((kept_ns, _), all)) if kept_ns == ns && **all == fresh => all.clone(),
        _ => Arc::new(fresh),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A list read again at a later index is the kept one while the namespace's devices are the
    /// same; another namespace's, or changed devices, make a list of their own.
    #[test]
    fn a_gathering_keeps_one_device_list_across_later_entries() {
        let devices = |s: &'static [u8]| vec![DeviceInfo::Xla(bytes::Bytes::from_static(s))];
        let ns: Ns = None;
        let kept: DevicesAt = ((ns.clone(), 7), Arc::new(devices(b"a")));
        let again = same_devices(Some(&kept), &ns, devices(b"a"));
        assert!(
            Arc::ptr_eq(&again, &kept.1),
            "the same devices: the kept list"
        );
        let changed = same_devices(Some(&kept), &ns, devices(b"b"));
        assert!(!Arc::ptr_eq(&changed, &kept.1));
        assert_eq!(*changed, devices(b"b"));
        let other: Ns = Some("other".into());
        let elsewhere = same_devices(Some(&kept), &other, devices(b"a"));
        assert!(
            !Arc::ptr_eq(&elsewhere, &kept.1),
            "another namespace's list"
        );
        assert_eq!(*same_devices(None, &ns, devices(b"a")), devices(b"a"));
    }
}

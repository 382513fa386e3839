//! Barrier arrivals a sidecar sends together, and the one wait it parks per barrier instance.
//!
//! With one parked call per task, a barrier of 100,000 tasks is released as 100,000 answers, each
//! an HTTP/2 stream the leader wakes, finishes and sends (about 16 µs of its one worker thread
//! each on two cores: seconds in all). A sidecar carrying several tasks of a host instead records
//! its tasks' arrivals without parking them ([`CoordCore::barrier_arrival`]) and parks one call per
//! instance ([`CoordCore::await_instance`]), whose outcome it hands to each of its tasks: the
//! release answers one call per sidecar.
//!
//! WaitForAllTasks is the service's own barrier: its arrivals are recorded together the same way
//! ([`CoordCore::wait_for_all_arrival`]), and the sidecar then fetches the job's devices once, with
//! one of its tasks' own WaitForAllTasks call, for all of them. jaxlib's GetAliveTasks, a barrier
//! over the live tasks of a set, likewise: its asks recorded ([`CoordCore::alive_arrival`]) and
//! each round waited on once (`CoordCore::await_alive`).
//!
//! An arrival is recorded as the task's own Barrier call records it, by the same command, so a
//! task gets the same answer either way. Recording an arrival again is harmless (an instance keeps
//! a set of arrivals, and a finished one answers with its outcome), which lets a re-driven call
//! record its arrivals again without request ids of their own. A GetAliveTasks ask names no
//! round, so one recorded again would join the next: each is committed under a request number of
//! its own, as the task's own call is.

use coord_raft_store::state::{Code, DeviceInfo, Outcome, TaskName, TaskSet};
use coord_raft_store::{Op, Output, RequestId};

use super::{unexpected, CoordCore};
use crate::error::CoordError;

impl CoordCore {
    /// Records one task's arrival at a barrier as its own Barrier call would, without waiting:
    /// the instance's counter, and its outcome if it is decided. `named` is the arriving task and
    /// the participants as the call named them, or why they could not be read.
    pub async fn barrier_arrival(
        &self,
        barrier: String,
        counter: i64,
        timeout_ms: i64,
        named: Result<(TaskName, Vec<TaskName>), CoordError>,
    ) -> Result<(i64, Option<Outcome>), CoordError> {
        let (source, tasks) = named?;
        let op = Op::Barrier {
            id: barrier,
            counter,
            tasks,
            timeout_ms,
            source,
        };
        match self.commit(None, op).await? {
            Output::Barrier { counter, outcome } => Ok((counter, outcome)),
            other => Err(unexpected("Barrier", &other)),
        }
    }

    /// Records one task's WaitForAllTasks arrival with its devices, as its own call would, without
    /// waiting: the service's barrier instance, and its outcome if the job has gathered.
    pub async fn wait_for_all_arrival(
        &self,
        named: Result<(TaskName, DeviceInfo), CoordError>,
    ) -> Result<(i64, Option<Outcome>), CoordError> {
        let (task, devices) = named?;
        match self
            .commit(None, Op::WaitForAllTasks { task, devices })
            .await?
        {
            Output::Barrier { counter, outcome } => Ok((counter, outcome)),
            other => Err(unexpected("WaitForAllTasks", &other)),
        }
    }

    /// Records one task's GetAliveTasks of `set` as its own call would (under its own request
    /// id, so that a re-driven arrival is not taken for an ask of the next round), without
    /// waiting: the round it joined, and whether it finished that round (its answer is kept:
    /// [`CoordCore::await_alive`] answers it at once).
    pub async fn alive_arrival(
        &self,
        id: Option<RequestId>,
        named: Result<(TaskName, TaskSet), CoordError>,
    ) -> Result<(u64, bool), CoordError> {
        let (source, tasks) = named?;
        match self
            .commit(id, Op::GetAliveTasksOf { source, tasks })
            .await?
        {
            Output::Alive { generation, answer } => Ok((generation, answer.is_some())),
            other => Err(unexpected("GetAliveTasks", &other)),
        }
    }

    /// Waits until instance `counter` of `barrier` has an outcome (one that has not started yet is
    /// waited for). An instance finished so long ago that its outcome is no longer kept is
    /// FAILED_PRECONDITION: no wait could end.
    pub async fn await_instance(
        &self,
        barrier: String,
        counter: i64,
    ) -> Result<Outcome, CoordError> {
        if barrier.is_empty() {
            return Err(CoordError::status(
                Code::InvalidArgument,
                "barrier id must not be empty".into(),
            ));
        }
        if counter < 0 {
            return Err(CoordError::status(
                Code::InvalidArgument,
                format!("barrier {barrier:?}: counter {counter} is negative"),
            ));
        }
        let (epoch, slot) =
            self.barrier_slot(|| format!("AwaitBarrier of barrier {barrier:?} #{counter}"))?;
        self.read_index.linearize().await?;
        self.with_cluster(|c| match c.barriers.get(&barrier) {
            Some(rec) if counter < rec.counter && rec.outcome_of(counter).is_none() => {
                Err(CoordError::status(
                    Code::FailedPrecondition,
                    format!(
                        "barrier {barrier:?}: instance {counter} finished long ago and its outcome \
                         is no longer kept (the barrier is at instance {})",
                        rec.counter
                    ),
                ))
            }
            _ => Ok(()),
        })??;
        self.await_barrier(&barrier, counter, epoch, slot).await
    }
}

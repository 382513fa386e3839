//! Workers: a worker's first heartbeat registers it and gives it a task of every unfinished
//! iteration it can produce; a worker silent past its timeout is lost.
//!
//! TensorFlow's workers keep TensorFlow's semantics: never forgotten (a worker that stops
//! heartbeating keeps its tasks; its address coming back is the same worker), and a round-robin
//! iteration a worker has no task of (it was removed while the worker was away) gets a new
//! pending task for it. Unlike TensorFlow, a lost worker gets no task of iterations made
//! meanwhile, and when it heartbeats again it gets a task of every unfinished iteration it has
//! none of, as a new worker would (an ensemble outlives the jobs whose workers are gone).
//!
//! coord's data workers report delivery, so losing one is its death: its tasks are removed and
//! its leased splits go back to their providers. When it comes back it is a new registration
//! with new tasks (none of static sharding, whose shards were fixed when the job began).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::errors::status;
use super::{sharding, DispatcherOutput, DispatcherState, Worker, WorkerIndex};
use crate::error::{Code, OpError};

/// What a TensorFlow worker's heartbeat says of it.
pub(super) struct TfWorker<'a> {
    pub transfer_servers: &'a [Bytes],
    pub tags: &'a [String],
    pub uid: i64,
    pub index: Option<WorkerIndex>,
}

fn other_kind(address: &str, reports_delivery: bool) -> OpError {
    let (is, not) = if reports_delivery {
        ("a coord data worker", "TensorFlow's")
    } else {
        ("a TensorFlow worker", "coord's")
    };
    status(
        Code::FailedPrecondition,
        format!("worker {address} is registered as {is}; it cannot heartbeat as one of {not}"),
    )
}

impl DispatcherState {
    pub(super) fn worker_heartbeat(
        &mut self,
        address: &str,
        heard: TfWorker<'_>,
        rounds: &BTreeMap<i64, i64>,
    ) -> Result<DispatcherOutput, OpError> {
        let known = self.workers.get(address);
        if known.is_some_and(|w| w.reports_delivery) {
            return Err(other_kind(address, true));
        }
        let returning = known.is_some_and(|w| w.lost);
        let new = known.is_none();
        if new {
            let registration = self.new_registration();
            self.workers.insert(
                address.to_string(),
                Worker {
                    transfer_servers: heard.transfer_servers.to_vec(),
                    tags: heard.tags.to_vec(),
                    uid: heard.uid,
                    index: heard.index,
                    tasks: BTreeSet::new(),
                    lost: false,
                    reports_delivery: false,
                    registration,
                },
            );
        } else if let Some(w) = self.workers.get_mut(address) {
            w.lost = false;
        }
        if new || returning {
            // TF's CreateTasksForWorker, for the iterations it never had a task of (a finished
            // task is not made again: its data was produced).
            self.join_open_iterations(address, rounds);
        }
        // TF's FindNewTasks: round-robin iterations that lost this worker's task get a new one.
        for iteration in self.round_robin_iterations_without(address) {
            let round = rounds.get(&iteration).copied().unwrap_or(0);
            self.join_iteration(iteration, address, round);
        }
        Ok(DispatcherOutput::Done)
    }

    /// Gives the worker a task of every unfinished iteration it can produce and never had a task
    /// of (but none of a definition's static sharding, fixed when its job began).
    fn join_open_iterations(&mut self, address: &str, rounds: &BTreeMap<i64, i64>) {
        let open: Vec<i64> = self
            .iterations
            .values()
            .filter(|it| !it.finished && self.can_produce(address, it.id))
            .filter(|it| !self.ever_ran(address, it))
            .filter(|it| {
                !(self.reads_definition(it)
                    && self
                        .jobs
                        .get(&it.job)
                        .is_some_and(|j| sharding::is_static(j.sharding)))
            })
            .map(|it| it.id)
            .collect();
        for iteration in open {
            let round = rounds.get(&iteration).copied().unwrap_or(0);
            self.join_iteration(iteration, address, round);
        }
    }

    /// Unfinished round-robin iterations of TensorFlow's a TensorFlow worker has no assigned
    /// task of.
    pub fn round_robin_iterations_without(&self, address: &str) -> Vec<i64> {
        let Some(w) = self.workers.get(address).filter(|w| !w.reports_delivery) else {
            return Vec::new();
        };
        let assigned: BTreeSet<i64> = w
            .tasks
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .map(|t| t.iteration)
            .collect();
        self.iterations
            .values()
            .filter(|it| !it.finished && self.is_round_robin(it.job))
            .filter(|it| !assigned.contains(&it.id) && self.can_produce(address, it.id))
            .map(|it| it.id)
            .collect()
    }

    /// Whether the iteration has (or had: finished tasks are kept) a task on the worker's
    /// current registration, pending ones included; removed ones do not count.
    fn ever_ran(&self, address: &str, it: &super::Iteration) -> bool {
        let registration = self.workers.get(address).map(|w| w.registration);
        it.tasks
            .iter()
            .copied()
            .chain(it.pending.iter().map(|p| p.task))
            .filter_map(|t| self.tasks.get(&t))
            .any(|t| t.worker == address && !t.removed && Some(t.registration) == registration)
    }

    pub(super) fn worker_lost(&mut self, address: &str) -> Result<DispatcherOutput, OpError> {
        let w = self.workers.get_mut(address).ok_or_else(|| {
            status(
                Code::NotFound,
                format!("Worker with address {address} not found."),
            )
        })?;
        if w.reports_delivery {
            return Err(other_kind(address, true));
        }
        w.lost = true;
        Ok(DispatcherOutput::Done)
    }

    /// A coord data worker that is new, or was declared dead, registers: a new registration with
    /// a task of every unfinished iteration it can produce.
    pub(super) fn register_data_worker(
        &mut self,
        address: &str,
        rounds: &BTreeMap<i64, i64>,
    ) -> Result<DispatcherOutput, OpError> {
        match self.workers.get(address) {
            Some(w) if !w.reports_delivery => return Err(other_kind(address, false)),
            Some(w) if !w.lost => return Ok(DispatcherOutput::Registered(w.registration)),
            _ => {}
        }
        let registration = self.new_registration();
        self.workers.insert(
            address.to_string(),
            Worker {
                transfer_servers: Vec::new(),
                tags: Vec::new(),
                uid: 0,
                index: None,
                tasks: BTreeSet::new(),
                lost: false,
                reports_delivery: true,
                registration,
            },
        );
        self.join_open_iterations(address, rounds);
        Ok(DispatcherOutput::Registered(registration))
    }

    /// The leader heard nothing from the data worker for its timeout: it is dead. A stale
    /// verdict (about a registration since replaced, or already dead) changes nothing.
    pub(super) fn data_worker_timeout(
        &mut self,
        address: &str,
        registration: u64,
    ) -> DispatcherOutput {
        match self.workers.get_mut(address) {
            Some(w) if w.reports_delivery && w.registration == registration && !w.lost => {
                w.lost = true;
            }
            _ => return DispatcherOutput::Done,
        }
        let lost: Vec<(i64, i64)> = self
            .tasks
            .values()
            .filter(|t| t.worker == address && t.registration == registration && !t.removed)
            .map(|t| (t.id, t.iteration))
            .collect();
        for (task, _) in &lost {
            self.remove_for_dead_worker(*task);
        }
        let iterations: BTreeSet<i64> = lost.iter().map(|(_, it)| *it).collect();
        for it in iterations {
            self.maybe_finish(it);
        }
        DispatcherOutput::Done
    }
}

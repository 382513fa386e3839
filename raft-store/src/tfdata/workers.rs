//! Workers and their tasks: a worker's first heartbeat registers it and gives it a task of every
//! unfinished iteration; WorkerUpdate finishes tasks; an iteration finishes with its last task.
//!
//! As in TensorFlow, workers are never forgotten (a worker that stops heartbeating keeps its
//! tasks; its address coming back is the same worker), and a round-robin iteration a worker has
//! no task of (it was removed while the worker was away) gets a new pending task for it. Unlike
//! TensorFlow, a worker silent past the worker timeout is *lost*: iterations made meanwhile get
//! no task on it, and when it heartbeats again it gets a task of every unfinished iteration it
//! has none of, as a new worker would.

use std::collections::{BTreeMap, BTreeSet};

use super::{status, PendingTask, Task, TfDataOutput, TfDataState, Worker};
use crate::error::{Code, OpError};

/// TensorFlow's error for an unknown task id.
pub fn task_not_found(id: i64) -> OpError {
    status(Code::NotFound, format!("Task {id} not found"))
}

impl TfDataState {
    pub(super) fn worker_heartbeat(
        &mut self,
        address: &str,
        worker: Worker,
        rounds: &BTreeMap<i64, i64>,
    ) -> TfDataOutput {
        let returning = self.workers.get(address).is_some_and(|w| w.lost);
        if returning {
            if let Some(w) = self.workers.get_mut(address) {
                w.lost = false;
            }
        }
        let new = !self.workers.contains_key(address);
        if new {
            self.workers.insert(address.to_string(), worker);
        }
        if new || returning {
            // TF's CreateTasksForWorker, for the iterations it never had a task of (a finished
            // task is not made again: its data was produced).
            let open: Vec<(i64, bool)> = self
                .iterations
                .values()
                .filter(|it| !it.finished && !self.ever_ran(address, it))
                .map(|it| (it.id, self.is_round_robin(it.job)))
                .collect();
            for (iteration, round_robin) in open {
                if round_robin {
                    let round = rounds.get(&iteration).copied().unwrap_or(0) + 1;
                    self.create_pending_task(iteration, address, round);
                } else {
                    self.create_task(iteration, address, 0);
                }
            }
        }
        // TF's FindNewTasks: round-robin iterations that lost this worker's task get a new one.
        for iteration in self.round_robin_iterations_without(address) {
            let round = rounds.get(&iteration).copied().unwrap_or(0) + 1;
            self.create_pending_task(iteration, address, round);
        }
        TfDataOutput::Done
    }

    /// Unfinished round-robin iterations the worker has no assigned task of.
    pub fn round_robin_iterations_without(&self, address: &str) -> Vec<i64> {
        if !self.workers.contains_key(address) {
            return Vec::new();
        }
        let assigned = self.iterations_of(address);
        self.iterations
            .values()
            .filter(|it| !it.finished && self.is_round_robin(it.job))
            .filter(|it| !assigned.contains(&it.id))
            .map(|it| it.id)
            .collect()
    }

    /// The iterations the worker has an assigned, unfinished task of.
    fn iterations_of(&self, address: &str) -> BTreeSet<i64> {
        self.workers
            .get(address)
            .map(|w| {
                w.tasks
                    .iter()
                    .filter_map(|t| self.tasks.get(t))
                    .map(|t| t.iteration)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Whether the iteration has (or had: finished tasks are kept) a task on the worker, pending
    /// ones included.
    fn ever_ran(&self, address: &str, it: &super::Iteration) -> bool {
        it.tasks
            .iter()
            .copied()
            .chain(it.pending.iter().map(|p| p.task))
            .filter_map(|t| self.tasks.get(&t))
            .any(|t| t.worker == address)
    }

    pub(super) fn worker_lost(&mut self, address: &str) -> Result<TfDataOutput, OpError> {
        let w = self.workers.get_mut(address).ok_or_else(|| {
            status(
                Code::NotFound,
                format!("Worker with address {address} not found."),
            )
        })?;
        w.lost = true;
        Ok(TfDataOutput::Done)
    }

    pub(super) fn is_round_robin(&self, job: i64) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.num_consumers.is_some())
    }

    /// Makes a task of `iteration` on `worker`, read from `starting_round`.
    pub(super) fn create_task(&mut self, iteration: i64, worker: &str, starting_round: i64) -> i64 {
        let id = self.new_task(iteration, worker, starting_round);
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.tasks.push(id);
        }
        id
    }

    /// Makes a round-robin task that consumers start reading once they all agree on a round.
    pub(super) fn create_pending_task(&mut self, iteration: i64, worker: &str, round: i64) {
        let id = self.new_task(iteration, worker, round);
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.pending.push_back(PendingTask {
                task: id,
                target_round: round,
                ready: BTreeSet::new(),
                failures: 0,
            });
        }
    }

    fn new_task(&mut self, iteration: i64, worker: &str, starting_round: i64) -> i64 {
        let id = self.next.task;
        self.next.task += 1;
        self.tasks.insert(
            id,
            Task {
                id,
                iteration,
                worker: worker.to_string(),
                starting_round,
                finished: false,
            },
        );
        if let Some(w) = self.workers.get_mut(worker) {
            w.tasks.insert(id);
        }
        id
    }

    /// WorkerUpdate: every task named must exist (else nothing changes); finished ones are
    /// skipped, as in TF.
    pub(super) fn finish_tasks(
        &mut self,
        _address: &str,
        tasks: &[i64],
    ) -> Result<TfDataOutput, OpError> {
        if let Some(unknown) = tasks.iter().find(|t| !self.tasks.contains_key(t)) {
            return Err(task_not_found(*unknown));
        }
        for t in tasks {
            self.finish_task(*t);
        }
        Ok(TfDataOutput::Done)
    }

    /// Marks the task finished, takes it off its worker, and finishes its iteration with its last
    /// task (TF's FinishTask).
    pub(super) fn finish_task(&mut self, id: i64) {
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        if task.finished {
            return;
        }
        task.finished = true;
        let (worker, iteration) = (task.worker.clone(), task.iteration);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.tasks.remove(&id);
        }
        let all_finished = self.iterations.get(&iteration).is_some_and(|it| {
            it.tasks
                .iter()
                .all(|t| self.tasks.get(t).is_none_or(|t| t.finished))
        });
        if all_finished {
            if let Some(it) = self.iterations.get_mut(&iteration) {
                it.finished = true;
            }
        }
    }
}

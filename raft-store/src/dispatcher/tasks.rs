//! Tasks: one per (iteration, worker). Made with their iteration on every worker present that can
//! produce its dataset, or when a worker registers or comes back; finished when the worker says
//! its task produced its last element; removed when a worker that reports delivery is declared
//! dead (its leased splits go back to the provider).
//!
//! An iteration is finished once every task it reads from has finished (TensorFlow's
//! FinishTask). Where workers report delivery, also every split must be handed out and
//! delivered, and a DYNAMIC iteration whose workers all died is not finished: its splits wait
//! for a new worker.

use std::collections::BTreeSet;

use super::errors::task_not_found;
use super::ids::Kind;
use super::{sharding, DispatcherOutput, DispatcherState, PendingTask, Task};
use crate::error::OpError;

impl DispatcherState {
    /// Workers present (not lost) that can produce `dataset`, in address order.
    pub(super) fn producers(&self, dataset: &str) -> Vec<String> {
        let Some(definition) = self.datasets.get(dataset).map(|d| d.source.is_definition()) else {
            return Vec::new();
        };
        self.workers
            .iter()
            .filter(|(_, w)| !w.lost && w.reports_delivery == definition)
            .map(|(a, _)| a.clone())
            .collect()
    }

    /// Whether the worker at `address` can produce the iteration's dataset.
    pub(super) fn can_produce(&self, address: &str, iteration: i64) -> bool {
        let (Some(w), Some(it)) = (self.workers.get(address), self.iterations.get(&iteration))
        else {
            return false;
        };
        self.iteration_dataset(it)
            .is_some_and(|d| d.source.is_definition() == w.reports_delivery)
    }

    /// Makes a task of a new iteration on every worker that can produce it (each its shard, for
    /// a definition's static sharding); returns them.
    pub(super) fn create_tasks(&mut self, iteration: i64) -> Vec<i64> {
        let Some(dataset) = self
            .iterations
            .get(&iteration)
            .and_then(|it| self.jobs.get(&it.job))
            .map(|j| j.dataset.clone())
        else {
            return Vec::new();
        };
        let workers = self.producers(&dataset);
        workers
            .iter()
            .enumerate()
            .map(|(shard, w)| {
                let id = self.new_task(iteration, w, 0, shard as u64);
                if let Some(it) = self.iterations.get_mut(&iteration) {
                    it.tasks.push(id);
                }
                id
            })
            .collect()
    }

    /// Makes a task of `iteration` on `worker`, read from `starting_round`.
    pub(super) fn create_task(&mut self, iteration: i64, worker: &str, starting_round: i64) -> i64 {
        let id = self.new_task(iteration, worker, starting_round, 0);
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.tasks.push(id);
        }
        id
    }

    /// Makes a round-robin task that consumers start reading once they all agree on a round.
    pub(super) fn create_pending_task(&mut self, iteration: i64, worker: &str, round: i64) {
        let id = self.new_task(iteration, worker, round, 0);
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.pending.push_back(PendingTask {
                task: id,
                target_round: round,
                ready: BTreeSet::new(),
                failures: 0,
            });
        }
    }

    /// A task of the iteration on a worker that joined it: pending under round-robin reads (one
    /// round after the latest its clients reported, from `rounds`), else read from the start.
    pub(super) fn join_iteration(&mut self, iteration: i64, worker: &str, latest_round: i64) {
        let round_robin = self
            .iterations
            .get(&iteration)
            .is_some_and(|it| self.is_round_robin(it.job));
        if round_robin {
            self.create_pending_task(iteration, worker, latest_round.saturating_add(1));
        } else {
            self.create_task(iteration, worker, 0);
        }
    }

    fn new_task(
        &mut self,
        iteration: i64,
        worker: &str,
        starting_round: i64,
        shard_index: u64,
    ) -> i64 {
        let id = self.new_id(Kind::Task);
        let registration = self.workers.get(worker).map_or(0, |w| w.registration);
        self.tasks.insert(
            id,
            Task {
                id,
                iteration,
                worker: worker.to_string(),
                registration,
                starting_round,
                shard_index,
                finished: false,
                removed: false,
            },
        );
        if let Some(w) = self.workers.get_mut(worker) {
            w.tasks.insert(id);
        }
        id
    }

    /// WorkerUpdate: every task named must exist (else nothing changes); finished ones are
    /// skipped, as in TF.
    pub(super) fn finish_tasks(&mut self, tasks: &[i64]) -> Result<DispatcherOutput, OpError> {
        if let Some(unknown) = tasks.iter().find(|t| !self.tasks.contains_key(t)) {
            return Err(task_not_found(*unknown));
        }
        for t in tasks {
            self.finish_task(*t);
        }
        Ok(DispatcherOutput::Done)
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
        self.maybe_finish(iteration);
    }

    /// The task's worker was declared dead: consumers stop reading it, its leases go back.
    pub(super) fn remove_for_dead_worker(&mut self, id: i64) {
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        task.removed = true;
        let (worker, iteration) = (task.worker.clone(), task.iteration);
        if let Some(w) = self.workers.get_mut(&worker) {
            w.tasks.remove(&id);
        }
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.pending.retain(|p| p.task != id);
            for p in it.providers.iter_mut().flatten() {
                p.revoke(id);
            }
        }
    }

    /// Marks the iteration finished if it is (see the module's doc).
    pub(super) fn maybe_finish(&mut self, iteration: i64) {
        let Some(it) = self.iterations.get(&iteration) else {
            return;
        };
        if it.finished {
            return;
        }
        let tasks: Vec<&Task> = it.tasks.iter().filter_map(|t| self.tasks.get(t)).collect();
        let done = tasks.iter().all(|t| t.finished || t.removed);
        let finished = if self.reads_definition(it) {
            let dynamic = self
                .jobs
                .get(&it.job)
                .is_some_and(|j| j.sharding == sharding::DYNAMIC);
            let splits_done = it.providers.iter().flatten().all(|p| p.exhausted());
            let any_live = tasks.iter().any(|t| !t.removed);
            done && splits_done && (any_live || !dynamic)
        } else {
            done
        };
        if finished {
            if let Some(it) = self.iterations.get_mut(&iteration) {
                it.finished = true;
            }
        }
    }
}

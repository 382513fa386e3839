//! Workers: a heartbeat from an unknown worker registers it, with a task for every unfinished
//! job; a worker silent past its timeout is declared dead and its tasks removed.
//!
//! TF never forgets a worker and never moves its work; here a dead worker's leased splits go back
//! to the job's provider, and a worker that comes back registers anew (new id, new tasks).

use std::collections::BTreeMap;

use super::{rounds::PendingTask, DispatchOutput, DispatcherState, Mode, Worker};

impl DispatcherState {
    pub(super) fn register_worker(
        &mut self,
        address: &str,
        rounds: &BTreeMap<u64, i64>,
    ) -> DispatchOutput {
        if let Some(w) = self.workers.get(address).filter(|w| w.alive) {
            return DispatchOutput::Worker { id: w.id };
        }
        let id = self.next_id();
        self.workers
            .insert(address.to_string(), Worker { id, alive: true });
        // One task per unfinished job, except under static sharding, whose shards were fixed
        // when the job began.
        let jobs: Vec<u64> = self
            .jobs
            .values()
            .filter(|j| !j.finished && !j.mode.is_static())
            .map(|j| j.id)
            .collect();
        for job_id in jobs {
            let Some(round_robin) = self.jobs.get(&job_id).map(|j| j.num_consumers.is_some())
            else {
                continue;
            };
            // A round-robin task waits as pending until every consumer agrees on its round.
            let start = (!round_robin).then_some(0);
            let task = self.new_task(job_id, address.to_string(), id, 0, start);
            let Some(job) = self.jobs.get_mut(&job_id) else {
                continue;
            };
            job.tasks.push(task);
            if round_robin {
                let round = rounds.get(&job_id).copied().unwrap_or(0);
                job.pending.push_back(PendingTask::new(task, round));
            }
        }
        DispatchOutput::Worker { id }
    }

    pub(super) fn worker_timeout(&mut self, address: &str, worker_id: u64) -> DispatchOutput {
        match self.workers.get_mut(address) {
            Some(w) if w.id == worker_id && w.alive => w.alive = false,
            // Already declared dead, or re-registered since the leader judged it.
            _ => return DispatchOutput::Done,
        }
        let lost: Vec<(u64, u64)> = self
            .tasks
            .values()
            .filter(|t| t.worker == address && t.worker_id == worker_id && !t.removed)
            .map(|t| (t.id, t.job))
            .collect();
        for (task, job_id) in &lost {
            if let Some(t) = self.tasks.get_mut(task) {
                t.removed = true;
            }
            if let Some(job) = self.jobs.get_mut(job_id) {
                if job.mode == Mode::Dynamic {
                    job.splits.revoke(*task);
                }
                job.pending.retain(|p| p.task != *task);
            }
        }
        let jobs: std::collections::BTreeSet<u64> = lost.iter().map(|(_, j)| *j).collect();
        for job in jobs {
            self.check_job_finished(job);
        }
        DispatchOutput::Done
    }
}

//! Datasets, jobs and clients: registration with fingerprint dedupe, named jobs that must match,
//! one task per live worker, client release and job collection.

use std::collections::{BTreeSet, VecDeque};

use bytes::Bytes;

use super::{
    not_found, splits::SplitProvider, status, DispatchOutput, DispatcherState, Job, Mode, Task,
};
use crate::error::{Code, OpError};

impl DispatcherState {
    pub(super) fn register_dataset(
        &mut self,
        fingerprint: u64,
        def: &Bytes,
        total_splits: Option<u64>,
    ) -> DispatchOutput {
        if let Some(&id) = self.by_fingerprint.get(&fingerprint) {
            return DispatchOutput::Dataset { id, created: false };
        }
        let id = self.next_id();
        self.datasets.insert(
            id,
            super::Dataset {
                fingerprint,
                def: def.clone(),
                total_splits,
            },
        );
        self.by_fingerprint.insert(fingerprint, id);
        DispatchOutput::Dataset { id, created: true }
    }

    pub(super) fn get_or_create_job(
        &mut self,
        dataset: u64,
        mode: Mode,
        name: Option<&str>,
        num_consumers: Option<u64>,
    ) -> Result<DispatchOutput, OpError> {
        let Some(ds) = self.datasets.get(&dataset) else {
            return Err(not_found("dataset", dataset));
        };
        let job_id = match name.and_then(|n| self.named_jobs.get(n).map(|j| (n, *j))) {
            Some((n, id)) => {
                let Some(job) = self.jobs.get(&id) else {
                    return Err(status(
                        Code::Internal,
                        format!("job name {n:?} points at job {id}, which does not exist"),
                    ));
                };
                validate_matching(job, n, dataset, mode, num_consumers)?;
                if job.finished {
                    return Err(status(
                        Code::FailedPrecondition,
                        format!(
                            "job {n:?} (id {id}) has finished{}; use another name for a new job",
                            if job.garbage_collected {
                                " and was garbage-collected"
                            } else {
                                ""
                            }
                        ),
                    ));
                }
                id
            }
            None => {
                if let Some(n) = num_consumers {
                    if n == 0 {
                        return Err(status(
                            Code::InvalidArgument,
                            "num_consumers must be positive".into(),
                        ));
                    }
                    if mode != Mode::Off {
                        return Err(status(
                            Code::InvalidArgument,
                            format!("round-robin reads (num_consumers={n}) need processing mode OFF, not {mode:?}"),
                        ));
                    }
                    if ds.total_splits.is_some() {
                        return Err(status(
                            Code::InvalidArgument,
                            format!("round-robin reads (num_consumers={n}) need an infinite dataset; dataset {dataset} ends (add repeat with count 0)"),
                        ));
                    }
                }
                let live: Vec<(String, u64)> = self
                    .workers
                    .iter()
                    .filter(|(_, w)| w.alive)
                    .map(|(a, w)| (a.clone(), w.id))
                    .collect();
                if mode.is_static() && live.is_empty() {
                    return Err(status(
                        Code::FailedPrecondition,
                        format!("static sharding ({mode:?}) divides the data among the workers registered when the job starts, and none is registered"),
                    ));
                }
                let total = ds.total_splits;
                let id = self.next_id();
                let mut job = Job {
                    id,
                    name: name.map(str::to_string),
                    dataset,
                    mode,
                    num_consumers,
                    num_shards: live.len() as u64,
                    tasks: Vec::new(),
                    clients: BTreeSet::new(),
                    idle_since_ms: None,
                    finished: false,
                    garbage_collected: false,
                    splits: SplitProvider::new(total),
                    pending: VecDeque::new(),
                };
                for (shard, (address, worker_id)) in live.into_iter().enumerate() {
                    // Round-robin: the tasks made with the job are read from round 0.
                    let task = self.new_task(id, address, worker_id, shard as u64, Some(0));
                    job.tasks.push(task);
                }
                if let Some(n) = name {
                    self.named_jobs.insert(n.to_string(), id);
                }
                self.jobs.insert(id, job);
                id
            }
        };
        let client = self.next_id();
        self.clients.insert(client, job_id);
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.clients.insert(client);
            job.idle_since_ms = None;
        }
        Ok(DispatchOutput::Job {
            job: job_id,
            client,
        })
    }

    /// Makes a task of job `job` on the worker (not yet listed in the job's tasks); `None` as the
    /// starting round makes it pending (round-robin).
    pub(super) fn new_task(
        &mut self,
        job: u64,
        worker: String,
        worker_id: u64,
        shard: u64,
        starting_round: Option<i64>,
    ) -> u64 {
        let id = self.next_id();
        self.tasks.insert(
            id,
            Task {
                id,
                job,
                worker,
                worker_id,
                shard_index: shard,
                starting_round,
                finished: false,
                removed: false,
            },
        );
        id
    }

    pub(super) fn release_client(
        &mut self,
        client: u64,
        now_ms: u64,
    ) -> Result<DispatchOutput, OpError> {
        let Some(job_id) = self.clients.remove(&client) else {
            return Err(not_found("job client", client));
        };
        if let Some(job) = self.jobs.get_mut(&job_id) {
            job.clients.remove(&client);
            if job.clients.is_empty() {
                job.idle_since_ms = Some(now_ms);
            }
            // A round-robin consumer that left can no longer agree to a pending task.
            for p in &mut job.pending {
                p.ready.remove(&client);
            }
        }
        Ok(DispatchOutput::Done)
    }

    pub(super) fn collect_job(&mut self, job_id: u64) -> Result<DispatchOutput, OpError> {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Err(not_found("job", job_id));
        };
        if !job.clients.is_empty() {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "job {job_id} has {} clients; it is not collected",
                    job.clients.len()
                ),
            ));
        }
        job.finished = true;
        job.garbage_collected = true;
        job.pending.clear();
        let tasks = job.tasks.clone();
        for t in tasks {
            if let Some(task) = self.tasks.get_mut(&t) {
                task.removed = true;
            }
        }
        Ok(DispatchOutput::Done)
    }

    /// Marks the job finished once every task it still reads from has finished and, under DYNAMIC
    /// sharding, every split is handed out and delivered.
    pub(super) fn check_job_finished(&mut self, job_id: u64) {
        let Some(job) = self.jobs.get(&job_id) else {
            return;
        };
        if job.finished {
            return;
        }
        let tasks_done = job
            .tasks
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .all(|t| t.finished || t.removed);
        let splits_done = job.mode != Mode::Dynamic || job.splits.exhausted();
        let any_live = job
            .tasks
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .any(|t| !t.removed);
        // A DYNAMIC job whose workers all died is not finished: its splits wait for a new worker.
        if tasks_done && splits_done && (any_live || job.mode != Mode::Dynamic) {
            if let Some(job) = self.jobs.get_mut(&job_id) {
                job.finished = true;
            }
        }
    }
}

fn validate_matching(
    job: &Job,
    name: &str,
    dataset: u64,
    mode: Mode,
    num_consumers: Option<u64>,
) -> Result<(), OpError> {
    let mut diffs = Vec::new();
    if job.dataset != dataset {
        diffs.push(format!("dataset {} (asked {dataset})", job.dataset));
    }
    if job.mode != mode {
        diffs.push(format!("processing mode {:?} (asked {mode:?})", job.mode));
    }
    if job.num_consumers != num_consumers {
        diffs.push(format!(
            "num_consumers {:?} (asked {num_consumers:?})",
            job.num_consumers
        ));
    }
    if diffs.is_empty() {
        return Ok(());
    }
    Err(status(
        Code::InvalidArgument,
        format!(
            "job {name:?} (id {}) exists with {}",
            job.id,
            diffs.join(", ")
        ),
    ))
}

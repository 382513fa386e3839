//! Jobs, iterations and iteration clients: GetOrCreateJob, GetOrCreateIteration,
//! ReleaseIterationClient and the garbage collection of idle iterations.
//!
//! A job is a named way of reading a dataset (processing mode, consumers, target workers); its
//! iterations are its repetitions, each with one task per worker present (not lost, and able to
//! produce the dataset) when it was made; a worker that registers or comes back later gets one
//! then. A client of an iteration is one consumer reading it.

use std::collections::VecDeque;

use super::errors::{dataset_not_found, iteration_not_found, job_not_found, status, wrong_kind};
use super::ids::Kind;
use super::{
    sharding, DispatcherOutput, DispatcherState, Iteration, Job, Leases, Provider, ProviderSpec,
};
use crate::error::{Code, OpError};

/// What GetOrCreateJob asks for.
pub(super) struct JobRequest<'a> {
    pub dataset: &'a str,
    pub sharding: i32,
    pub name: Option<&'a str>,
    pub anonymous_tag: u64,
    pub num_consumers: Option<i64>,
    pub target_workers: i32,
    pub cross_trainer_cache: bool,
}

impl DispatcherState {
    pub(super) fn get_or_create_job(
        &mut self,
        req: JobRequest<'_>,
    ) -> Result<DispatcherOutput, OpError> {
        if let Some(id) = req.name.and_then(|n| self.jobs_by_name.get(n)) {
            let job = self.jobs.get(id).ok_or_else(|| job_not_found(*id))?;
            validate_matching(job, &req)?;
            if let Some(d) = self.datasets.get(&job.dataset) {
                if d.source.is_definition() {
                    return Err(wrong_kind(&job.dataset, d));
                }
            }
            return Ok(DispatcherOutput::Job(job.id));
        }
        let dataset = self
            .datasets
            .get(req.dataset)
            .ok_or_else(|| dataset_not_found(req.dataset))?;
        if dataset.source.is_definition() {
            return Err(wrong_kind(req.dataset, dataset));
        }
        if !(sharding::OFF..=sharding::HINT).contains(&req.sharding) {
            return Err(status(
                Code::InvalidArgument,
                format!(
                    "ProcessingMode {{ sharding_policy: {} }} does not specify a valid sharding \
                     policy (OFF, DYNAMIC, FILE, DATA, FILE_OR_DATA or HINT)",
                    req.sharding
                ),
            ));
        }
        if let Some(n) = req.num_consumers.filter(|n| *n <= 0) {
            return Err(status(
                Code::InvalidArgument,
                format!("num_consumers must be positive, got {n}"),
            ));
        }
        let id = self.new_job(
            req.name,
            req.anonymous_tag,
            Job {
                id: 0,
                name: String::new(),
                anonymous: false,
                dataset: req.dataset.to_string(),
                sharding: req.sharding,
                num_consumers: req.num_consumers,
                target_workers: req.target_workers,
                cross_trainer_cache: req.cross_trainer_cache,
            },
        );
        Ok(DispatcherOutput::Job(id))
    }

    /// Adds `job` under a new id and its name (made up for an anonymous job, as TF does).
    pub(super) fn new_job(&mut self, name: Option<&str>, anonymous_tag: u64, mut job: Job) -> i64 {
        let id = self.fresh_id(Kind::Job);
        job.id = id;
        job.anonymous = name.is_none();
        job.name = match name {
            Some(n) => n.to_string(),
            None => format!("anonymous_job_{id}_{anonymous_tag}"),
        };
        self.jobs_by_name.insert(job.name.clone(), id);
        self.jobs.insert(id, job);
        id
    }

    pub(super) fn get_or_create_iteration(
        &mut self,
        job_id: i64,
        repetition: i64,
        providers: &[ProviderSpec],
    ) -> Result<DispatcherOutput, OpError> {
        let job = self
            .jobs
            .get(&job_id)
            .ok_or_else(|| job_not_found(job_id))?;
        let existing = self
            .iterations_by_key
            .get(&(job.name.clone(), repetition))
            .and_then(|i| self.iterations.get(i))
            .filter(|it| !it.garbage_collected)
            .map(|it| it.id);
        let (iteration, new_tasks) = match existing {
            Some(id) => (id, Vec::new()),
            None => {
                if job.sharding == sharding::DYNAMIC && providers.is_empty() {
                    return Err(status(
                        Code::FailedPrecondition,
                        format!(
                            "job {job_id} shards dynamically but its iteration came with no \
                             split providers"
                        ),
                    ));
                }
                let providers = (job.sharding == sharding::DYNAMIC).then(|| {
                    providers
                        .iter()
                        .map(|p| provider(p.spec.clone(), p.splits, false))
                        .collect()
                });
                let id = self.new_iteration(job_id, repetition, providers, 0);
                (id, self.create_tasks(id))
            }
        };
        let client = self.add_client(iteration);
        Ok(DispatcherOutput::Iteration {
            client,
            iteration,
            new_tasks,
        })
    }

    /// Adds an iteration of `job` (no tasks yet) under a new id and its (name, repetition) key.
    pub(super) fn new_iteration(
        &mut self,
        job: i64,
        repetition: i64,
        providers: Option<Vec<Provider>>,
        num_shards: u64,
    ) -> i64 {
        let id = self.new_id(Kind::Iteration);
        if let Some(name) = self.jobs.get(&job).map(|j| j.name.clone()) {
            self.iterations_by_key.insert((name, repetition), id);
        }
        self.iterations.insert(
            id,
            Iteration {
                id,
                job,
                repetition,
                providers,
                tasks: Vec::new(),
                pending: VecDeque::new(),
                num_clients: 0,
                last_client_released_micros: -1,
                num_shards,
                finished: false,
                garbage_collected: false,
            },
        );
        id
    }

    /// A new client of `iteration`.
    pub(super) fn add_client(&mut self, iteration: i64) -> i64 {
        let client = self.new_id(Kind::Client);
        self.clients.insert(client, iteration);
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.num_clients += 1;
        }
        client
    }

    pub(super) fn release_client(
        &mut self,
        client: i64,
        time_micros: i64,
    ) -> Result<DispatcherOutput, OpError> {
        let iteration = self.client_iteration(client)?.id;
        self.clients.remove(&client);
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.num_clients -= 1;
            it.last_client_released_micros = time_micros;
            // A consumer that left can no longer agree to a pending task.
            for p in &mut it.pending {
                p.ready.remove(&client);
            }
        }
        Ok(DispatcherOutput::Done)
    }

    pub(super) fn garbage_collect_iteration(
        &mut self,
        iteration: i64,
    ) -> Result<DispatcherOutput, OpError> {
        let it = self
            .iterations
            .get(&iteration)
            .ok_or_else(|| iteration_not_found(iteration))?;
        if it.finished || it.num_clients > 0 {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "iteration {iteration} is {}; it is not collected",
                    if it.finished {
                        "finished".to_string()
                    } else {
                        format!("read by {} clients", it.num_clients)
                    }
                ),
            ));
        }
        let tasks: Vec<i64> = it
            .tasks
            .iter()
            .copied()
            .chain(it.pending.iter().map(|p| p.task))
            .collect();
        // Its tasks end (TF's FinishTask) and nobody reads them any more.
        for t in tasks {
            self.finish_task(t);
            if let Some(task) = self.tasks.get_mut(&t) {
                task.removed = true;
            }
        }
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.pending.clear();
            it.finished = true;
            it.garbage_collected = true;
        }
        Ok(DispatcherOutput::Done)
    }
}

/// A provider at its start, with leases when its workers report delivery.
pub(super) fn provider(spec: bytes::Bytes, splits: u64, leased: bool) -> Provider {
    Provider {
        spec,
        splits,
        repetition: 0,
        index: 0,
        leases: leased.then(Leases::default),
    }
}

/// TensorFlow's ValidateMatchingJob: a named job found again must be asked for the same way
/// (processing mode, cross-trainer cache, target workers; not the dataset, as in TF).
fn validate_matching(job: &Job, req: &JobRequest<'_>) -> Result<(), OpError> {
    let mut diff = String::new();
    if job.sharding != req.sharding {
        diff.push_str(&format!(
            "Existing processing mode: <sharding_policy: {}>; got <sharding_policy: {}>. ",
            sharding::name(job.sharding),
            sharding::name(req.sharding)
        ));
    }
    if job.cross_trainer_cache != req.cross_trainer_cache {
        let word = |b: bool| if b { "enabled" } else { "disabled" };
        diff.push_str(&format!(
            "Existing cross-trainer cache: <{}>; got <{}>. ",
            word(job.cross_trainer_cache),
            word(req.cross_trainer_cache)
        ));
    }
    if job.target_workers != req.target_workers {
        diff.push_str(&format!(
            "Existing target workers: <{}>; got <{}>. ",
            target_workers_name(job.target_workers),
            target_workers_name(req.target_workers)
        ));
    }
    if diff.is_empty() {
        return Ok(());
    }
    Err(status(
        Code::InvalidArgument,
        format!(
            "Tried to create job with name {}, but found an existing job with different \
             parameters: {diff}",
            job.name
        ),
    ))
}

/// TensorFlow's `TargetWorkersToString`.
pub fn target_workers_name(t: i32) -> &'static str {
    match t {
        1 => "AUTO",
        2 => "ANY",
        3 => "LOCAL",
        _ => "UNSPECIFIED",
    }
}

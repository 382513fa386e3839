//! coord's jobs: a job of a coord definition, read once. coord's GetOrCreateJob makes (or joins)
//! the job and its one iteration and adds a client, all in one op; the iteration's id is the job
//! id coord's clients see.
//!
//! Its rules are coord's protocol's: a named job found again must be asked for the same way
//! (dataset, processing mode, consumers), a finished one is not joined again, round-robin reads
//! need OFF and a definition that repeats forever, and static sharding divides the data among
//! the workers present when the job starts (so it needs one).

use super::errors::{not_known, status, wrong_kind};
use super::jobs::provider;
use super::{sharding, DatasetSource, DispatcherOutput, DispatcherState, Iteration, Job, ENDLESS};
use crate::error::{Code, OpError};

/// What coord's GetOrCreateJob asks for.
pub(super) struct JoinRequest<'a> {
    pub dataset: &'a str,
    pub sharding: i32,
    pub name: Option<&'a str>,
    pub anonymous_tag: u64,
    pub num_consumers: Option<i64>,
}

impl DispatcherState {
    pub(super) fn join_job(&mut self, req: JoinRequest<'_>) -> Result<DispatcherOutput, OpError> {
        let Some(dataset) = self.datasets.get(req.dataset) else {
            return Err(not_known("dataset", req.dataset));
        };
        let DatasetSource::Definition { total_splits, .. } = &dataset.source else {
            return Err(wrong_kind(req.dataset, dataset));
        };
        let total_splits = *total_splits;
        if !(sharding::OFF..=sharding::DATA).contains(&req.sharding) {
            return Err(status(
                Code::InvalidArgument,
                format!(
                    "processing mode {} is not one of OFF (0), DYNAMIC (1), FILE (2), DATA (3)",
                    req.sharding
                ),
            ));
        }
        let existing = req
            .name
            .and_then(|n| self.jobs_by_name.get(n))
            .and_then(|j| self.jobs.get(j))
            .map(|j| (j, self.iterations_by_key.get(&(j.name.clone(), 0))));
        let iteration = match existing {
            Some((job, iteration)) => {
                let it = iteration
                    .and_then(|i| self.iterations.get(i))
                    .ok_or_else(|| {
                        status(
                            Code::Internal,
                            format!("job {:?} has no iteration", job.name),
                        )
                    })?;
                validate_matching(job, it, &req)?;
                if it.finished {
                    return Err(status(
                        Code::FailedPrecondition,
                        format!(
                            "job {:?} (id {}) has finished{}; use another name for a new job",
                            job.name,
                            it.id,
                            if it.garbage_collected {
                                " and was garbage-collected"
                            } else {
                                ""
                            }
                        ),
                    ));
                }
                it.id
            }
            None => self.new_definition_job(&req, total_splits)?,
        };
        let client = self.add_client(iteration);
        Ok(DispatcherOutput::Iteration {
            client,
            iteration,
            new_tasks: Vec::new(),
        })
    }

    fn new_definition_job(
        &mut self,
        req: &JoinRequest<'_>,
        total_splits: Option<u64>,
    ) -> Result<i64, OpError> {
        if let Some(n) = req.num_consumers {
            if n <= 0 {
                return Err(status(
                    Code::InvalidArgument,
                    "num_consumers must be positive".into(),
                ));
            }
            if req.sharding != sharding::OFF {
                return Err(status(
                    Code::InvalidArgument,
                    format!(
                        "round-robin reads (num_consumers={n}) need processing mode OFF, not {}",
                        sharding::name(req.sharding)
                    ),
                ));
            }
            if total_splits.is_some() {
                return Err(status(
                    Code::InvalidArgument,
                    format!(
                        "round-robin reads (num_consumers={n}) need an infinite dataset; dataset \
                         {} ends (add repeat with count 0)",
                        req.dataset
                    ),
                ));
            }
        }
        let present = self.producers(req.dataset).len() as u64;
        if sharding::is_static(req.sharding) && present == 0 {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "static sharding ({}) divides the data among the workers registered when the \
                     job starts, and none is registered",
                    sharding::name(req.sharding)
                ),
            ));
        }
        let job = self.new_job(
            req.name,
            req.anonymous_tag,
            Job {
                id: 0,
                name: String::new(),
                anonymous: true,
                dataset: req.dataset.to_string(),
                sharding: req.sharding,
                num_consumers: req.num_consumers,
                target_workers: 0,
                cross_trainer_cache: false,
            },
        );
        let providers = (req.sharding == sharding::DYNAMIC).then(|| {
            vec![provider(
                bytes::Bytes::new(),
                total_splits.unwrap_or(ENDLESS),
                true,
            )]
        });
        let iteration = self.new_iteration(job, 0, providers, present);
        self.create_tasks(iteration);
        Ok(iteration)
    }
}

/// A named job found again must be asked for the same dataset, mode and consumers.
fn validate_matching(job: &Job, it: &Iteration, req: &JoinRequest<'_>) -> Result<(), OpError> {
    let mut diffs = Vec::new();
    if job.dataset != req.dataset {
        diffs.push(format!("dataset {} (asked {})", job.dataset, req.dataset));
    }
    if job.sharding != req.sharding {
        diffs.push(format!(
            "processing mode {} (asked {})",
            sharding::name(job.sharding),
            sharding::name(req.sharding)
        ));
    }
    if job.num_consumers != req.num_consumers {
        diffs.push(format!(
            "num_consumers {:?} (asked {:?})",
            job.num_consumers, req.num_consumers
        ));
    }
    if diffs.is_empty() {
        return Ok(());
    }
    Err(status(
        Code::InvalidArgument,
        format!(
            "job {:?} (id {}) exists with {}",
            job.name,
            it.id,
            diffs.join(", ")
        ),
    ))
}

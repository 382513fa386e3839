//! The tf.data dispatcher (TensorFlow 2.21's `DataServiceDispatcherImpl`), replicated: the one
//! state behind both of the ensemble's dispatcher surfaces, TensorFlow's
//! `tensorflow.data.DispatcherService` (unmodified TF workers and `distribute()` clients) and
//! coord's own `coord.dispatcher.Dispatcher` (coord's data workers and consumers). The Raft log
//! is its journal.
//!
//! TensorFlow's dispatcher changes its state only through `Apply(Update)`, several journal
//! records per RPC, under one mutex. Here one RPC is one [`DispatcherOp`], applied atomically by
//! the same deterministic `apply` on every replica; a refused op changes nothing. A snapshot holds
//! the state itself, so a restart costs what the state weighs, not what its history weighs.
//!
//! The model is TensorFlow's, with its names, ids and codes, because TensorFlow's clients read
//! them: dataset ids are strings (a client may choose one), ids start where TF's do (datasets
//! 1000, iterations 2000, iteration clients 3000, tasks 4000, jobs 5000), a job is named (an
//! anonymous job gets a unique name), an iteration is a job's repetition, tasks are per
//! (iteration, worker). coord's protocol reads the same records: its datasets are definitions
//! (ranges and record files, deduped by fingerprint), its job is a job read once (one iteration,
//! whose id is the job id coord's clients see), and its workers report each split's delivery, so
//! their splits are leased: a worker declared dead has its tasks removed and its leased splits
//! handed out again (at-least-once; elements keep their (split, offset) identity, so consumers
//! drop duplicates). TensorFlow's workers keep TensorFlow's semantics: a split handed out is gone.
//! A worker only ever gets tasks of datasets it can produce (graphs for TensorFlow's workers,
//! definitions for coord's).
//!
//! What this state does not know: dataset graphs. The leader works out a DYNAMIC iteration's
//! split providers from the graph before it proposes, and an iteration keeps, per provider, an
//! opaque description, its split count and its position. What TensorFlow keeps in memory stays
//! in the leader's memory (heartbeat times, the round each round-robin client reads, consumers'
//! agreement to remove a task); the leader passes what an op needs of it inside the op.
//!
//! - [`model`]: the records. [`ops`]: the updates and their answers.
//! - `ids`: ids of each kind, and those of coord's dispatcher of before.
//! - `datasets`: registration (a graph with a client-chosen id, or a definition by fingerprint)
//!   and the compression decision.
//! - `jobs`: TensorFlow's jobs and iterations, clients, collection of idle iterations.
//! - `definitions`: coord's jobs: a job of a definition, read once.
//! - `workers`: worker registration and loss, for both kinds of workers.
//! - `tasks`: making, finishing and removing tasks; when an iteration is finished.
//! - `splits`: DYNAMIC sharding's providers, and leases for workers that report delivery.
//! - `rounds`: round-robin reads: pending tasks, consumers' agreement, task removal.
//! - [`legacy`]: the two states of before, read from old snapshots and logs into this one.

mod datasets;
mod definitions;
mod ids;
mod jobs;
pub mod legacy;
pub mod model;
pub mod ops;
mod rounds;
mod splits;
mod tasks;
#[cfg(test)]
mod tests;
mod workers;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Code, OpError};

pub use model::{
    Dataset, DatasetSource, Iteration, Job, Leases, LegacyIds, NextIds, PendingTask, Provider,
    ProviderSpec, Task, Worker, WorkerIndex, ENDLESS,
};
pub use ops::{DispatcherOp, DispatcherOutput, DispatcherResult, LeaseAnswer};

/// TensorFlow's `ProcessingModeDef.ShardingPolicy`, as its wire numbers. coord's
/// `ProcessingMode` (OFF, DYNAMIC, FILE, DATA) has the same numbers.
pub mod sharding {
    pub const OFF: i32 = 0;
    pub const DYNAMIC: i32 = 1;
    pub const FILE: i32 = 2;
    pub const DATA: i32 = 3;
    pub const FILE_OR_DATA: i32 = 4;
    pub const HINT: i32 = 5;

    /// Static sharding: worker i of n reads its share.
    pub fn is_static(policy: i32) -> bool {
        matches!(policy, FILE | DATA | FILE_OR_DATA | HINT)
    }

    pub fn name(policy: i32) -> &'static str {
        match policy {
            OFF => "OFF",
            DYNAMIC => "DYNAMIC",
            FILE => "FILE",
            DATA => "DATA",
            FILE_OR_DATA => "FILE_OR_DATA",
            HINT => "HINT",
            _ => "unknown",
        }
    }
}

/// `DataServiceMetadata.Compression`'s SNAPPY: the only compression that can be turned off.
pub const COMPRESSION_SNAPPY: i32 = 2;

/// Everything the dispatcher knows. A part of `CoordState`, so of every snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatcherState {
    pub datasets: BTreeMap<String, Dataset>,
    /// A definition's fingerprint -> its dataset.
    pub by_fingerprint: BTreeMap<u64, String>,
    pub workers: BTreeMap<String, Worker>,
    pub jobs: BTreeMap<i64, Job>,
    pub jobs_by_name: BTreeMap<String, i64>,
    pub iterations: BTreeMap<i64, Iteration>,
    /// (job name, repetition) -> the iteration (the latest, if one was garbage-collected).
    pub iterations_by_key: BTreeMap<(String, i64), i64>,
    /// Every task not removed by MaybeRemoveTask (TF forgets those).
    pub tasks: BTreeMap<i64, Task>,
    /// Iteration client -> its iteration.
    pub clients: BTreeMap<i64, i64>,
    pub next: NextIds,
    /// Ops applied so far (a refused op changes nothing and is not counted).
    pub updates: u64,
    /// DYNAMIC splits handed out for the first time, every iteration together.
    pub splits_handed_out: u64,
    /// Present when the state began as coord's dispatcher of before (see [`legacy`]).
    pub legacy: Option<LegacyIds>,
    /// While an update of coord's dispatcher of before is applied: its new ids number on from
    /// [`LegacyIds::last_id`], as that dispatcher's did. Never set between updates.
    #[serde(skip)]
    replaying_legacy: bool,
}

pub(crate) fn status(code: Code, message: String) -> OpError {
    OpError::Status { code, message }
}

impl DispatcherState {
    /// Applies one op. Times it needs travel inside it (picked by the leader), so apply reads no
    /// clock. A refused op changes nothing.
    pub fn apply(&mut self, op: &DispatcherOp) -> DispatcherResult {
        use DispatcherOp::*;
        let out = match op {
            RegisterDataset {
                requested_id,
                def,
                metadata,
                compression,
            } => self.register_dataset(requested_id.as_deref(), def, metadata, *compression),
            GetOrCreateJob {
                dataset,
                sharding,
                name,
                anonymous_tag,
                num_consumers,
                target_workers,
                cross_trainer_cache,
            } => self.get_or_create_job(jobs::JobRequest {
                dataset,
                sharding: *sharding,
                name: name.as_deref(),
                anonymous_tag: *anonymous_tag,
                num_consumers: *num_consumers,
                target_workers: *target_workers,
                cross_trainer_cache: *cross_trainer_cache,
            }),
            GetOrCreateIteration {
                job,
                repetition,
                providers,
            } => self.get_or_create_iteration(*job, *repetition, providers),
            WorkerHeartbeat {
                address,
                transfer_servers,
                tags,
                uid,
                index,
                rounds,
            } => self.worker_heartbeat(
                address,
                workers::TfWorker {
                    transfer_servers,
                    tags,
                    uid: *uid,
                    index: *index,
                },
                rounds,
            ),
            FinishTasks { address: _, tasks } => self.finish_tasks(tasks),
            GetSplit {
                iteration,
                repetition,
                provider,
                max,
            } => self.get_split(*iteration, *repetition, *provider, *max),
            ReleaseClient {
                client,
                time_micros,
            }
            | ClientTimeout {
                client,
                time_micros,
            } => self.release_client(*client, *time_micros),
            ClientHeartbeat {
                client,
                current_round,
                blocked_round,
                client_round,
            } => self.client_heartbeat(*client, *current_round, *blocked_round, *client_round),
            RemoveTask { task } => self.remove_task(*task),
            GarbageCollectIteration { iteration } | CollectJob { iteration } => {
                self.garbage_collect_iteration(*iteration)
            }
            DisableCompression { dataset, disable } => self.disable_compression(dataset, *disable),
            WorkerLost { address } => self.worker_lost(address),
            RegisterDefinition {
                fingerprint,
                def,
                total_splits,
            } => Ok(self.register_definition(*fingerprint, def, *total_splits)),
            JoinJob {
                dataset,
                sharding,
                name,
                anonymous_tag,
                num_consumers,
            } => self.join_job(definitions::JoinRequest {
                dataset,
                sharding: *sharding,
                name: name.as_deref(),
                anonymous_tag: *anonymous_tag,
                num_consumers: *num_consumers,
            }),
            RegisterDataWorker { address, rounds } => self.register_data_worker(address, rounds),
            DataWorkerTimeout {
                address,
                registration,
            } => Ok(self.data_worker_timeout(address, *registration)),
            LeaseSplits { task, done, max } => self.lease_splits(*task, done, *max),
            ReportDelivery {
                address,
                done,
                completed,
            } => self.report_delivery(address, done, completed),
        }?;
        self.updates += 1;
        Ok(out)
    }

    /// The tasks an iteration's clients read (TF's `TasksForIteration`): not removed.
    pub fn iteration_tasks<'a>(&'a self, it: &'a Iteration) -> impl Iterator<Item = &'a Task> {
        it.tasks
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .filter(|t| !t.removed)
    }

    /// The iteration of an iteration client, with TF's error for an unknown one.
    pub fn client_iteration(&self, client: i64) -> Result<&Iteration, OpError> {
        self.clients
            .get(&client)
            .and_then(|i| self.iterations.get(i))
            .ok_or_else(|| {
                status(
                    Code::NotFound,
                    format!("Iteration client id not found: {client}"),
                )
            })
    }

    /// Iteration clients whose iteration has not finished (TF's `ListActiveClientIds`).
    pub fn active_clients(&self) -> impl Iterator<Item = i64> + '_ {
        self.clients
            .iter()
            .filter(|(_, it)| self.iterations.get(it).is_some_and(|it| !it.finished))
            .map(|(c, _)| *c)
    }

    /// The dataset an iteration reads.
    pub fn iteration_dataset(&self, it: &Iteration) -> Option<&Dataset> {
        let job = self.jobs.get(&it.job)?;
        self.datasets.get(&job.dataset)
    }

    /// Whether the iteration reads a coord definition (its workers report delivery).
    pub fn reads_definition(&self, it: &Iteration) -> bool {
        self.iteration_dataset(it)
            .is_some_and(|d| d.source.is_definition())
    }

    pub(crate) fn is_round_robin(&self, job: i64) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.num_consumers.is_some())
    }
}

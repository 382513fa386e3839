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
//! The modules, bottom up (each uses only those before it; this file routes an op to them):
//!
//! - [`model`]: the records; [`sharding`]: TensorFlow's processing modes; `errors`: refusals, in
//!   each surface's words; [`ops`]: the updates and their answers.
//! - `state`: [`DispatcherState`] and what the surfaces read of it.
//! - `ids`: ids of each kind, and those of coord's dispatcher of before.
//! - `datasets`: registration (a graph with a client-chosen id, or a definition by fingerprint)
//!   and the compression decision.
//! - `jobs`: TensorFlow's jobs and iterations, clients, collection of idle iterations.
//! - `definitions`: coord's jobs: a job of a definition, read once.
//! - `tasks`: making, finishing and removing tasks; when an iteration is finished.
//! - `workers`: worker registration and loss, for both kinds of workers.
//! - `splits`: DYNAMIC sharding's providers, and leases for workers that report delivery.
//! - `rounds`: round-robin reads: pending tasks, consumers' agreement, task removal.
//! - [`legacy`]: the two states of before, read from old snapshots and logs into this one.

mod datasets;
mod definitions;
mod errors;
mod ids;
mod jobs;
pub mod legacy;
pub mod model;
pub mod ops;
mod rounds;
pub mod sharding;
mod splits;
mod state;
mod tasks;
#[cfg(test)]
mod tests;
mod workers;

pub use model::{
    Dataset, DatasetSource, Iteration, Job, Leases, LegacyIds, NextIds, PendingTask, Provider,
    ProviderSpec, Task, Worker, WorkerIndex, COMPRESSION_SNAPPY, ENDLESS,
};
pub use ops::{DispatcherOp, DispatcherOutput, DispatcherResult, LeaseAnswer};
pub use state::DispatcherState;

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
}

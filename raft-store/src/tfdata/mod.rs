//! TensorFlow's tf.data service dispatcher (`DataServiceDispatcherImpl` of TF 2.21), replicated:
//! the state behind `tensorflow.data.DispatcherService`, which unmodified TensorFlow workers and
//! `distribute()` clients call. The Raft log is its journal.
//!
//! TensorFlow's dispatcher changes its state only through `Apply(Update)`, one journal record per
//! update, several per RPC (a worker's first heartbeat registers it and makes one task per
//! iteration; a client's GetOrCreateIteration makes the iteration, its tasks and the client), all
//! under one mutex. Here one RPC is one [`TfDataOp`]: applied atomically by the same
//! deterministic `apply` on every replica, so a leader that dies between two of TF's updates
//! leaves no half-registered worker behind. A refused op changes nothing.
//!
//! The model is TensorFlow's, with its names, ids and codes, because TensorFlow's clients read
//! them: dataset ids are strings (the client may choose one), ids start where TF's do (datasets
//! 1000, iterations 2000, iteration clients 3000, tasks 4000, jobs 5000), a job is named (an
//! anonymous job gets a unique name), an iteration is a job's repetition, tasks are per
//! (iteration, worker), and workers are never forgotten.
//!
//! What this state does not know: dataset graphs. A dataset's `DatasetDef` and metadata are kept
//! as the bytes the client sent; the leader works out a DYNAMIC iteration's split providers from
//! the graph before it proposes, and an iteration keeps, per provider, only an opaque description
//! (for the server to turn split `i` into TensorFlow's split tensor), how many splits a
//! repetition has, and where it stands: (repetition, index). Restoring a provider is therefore
//! O(1), where TensorFlow replays its whole journal and fast-forwards each provider one
//! `GetNext` per split already handed out.
//!
//! What TensorFlow keeps in memory stays in the leader's memory: heartbeat times, the round each
//! round-robin client reads, consumers' agreement to remove a task. The leader passes what an op
//! needs of it (a client's latest round, the round a new pending task aims at) inside the op.
//!
//! - [`datasets`]: registration (with a client-chosen id) and the compression decision.
//! - [`jobs`]: jobs, iterations, iteration clients, garbage collection.
//! - [`workers`]: worker registration, tasks, task completion.
//! - [`splits`]: DYNAMIC sharding's split providers.
//! - [`rounds`]: round-robin reads: pending tasks, consumers' agreement, task removal.

mod datasets;
mod jobs;
mod rounds;
mod splits;
#[cfg(test)]
mod tests;
mod workers;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Code, OpError};

/// TensorFlow's `ProcessingModeDef.ShardingPolicy`, as its wire numbers.
pub mod sharding {
    pub const OFF: i32 = 0;
    pub const DYNAMIC: i32 = 1;
    pub const FILE: i32 = 2;
    pub const DATA: i32 = 3;
    pub const FILE_OR_DATA: i32 = 4;
    pub const HINT: i32 = 5;

    /// Static sharding: worker i of n reads its share; TF needs the fixed worker list for it.
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

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Dataset {
    /// The client's `DatasetDef`, encoded (handed to workers in their `TaskDef`s).
    pub def: Bytes,
    /// The client's `DataServiceMetadata`, encoded.
    pub metadata: Bytes,
    /// The metadata's compression (`DataServiceMetadata.Compression`).
    pub compression: i32,
    /// DisableCompressionAtRuntime's decision, once made (the first client's answer holds).
    pub compression_disabled: Option<bool>,
}

/// A worker's position in the configured worker list (static sharding only).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerIndex {
    pub index: i64,
    /// The length of the configured list: TF's `TaskDef.num_workers`.
    pub of: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// Its `DataTransferServerInfo`s, each encoded, as it sent them.
    pub transfer_servers: Vec<Bytes>,
    pub tags: Vec<String>,
    pub uid: i64,
    /// Where it stands in the configured worker list, when one is configured.
    pub index: Option<WorkerIndex>,
    /// The tasks assigned to it and not finished (TF's `tasks_by_worker_`): pending ones too.
    pub tasks: BTreeSet<i64>,
    /// Silent past the worker timeout: new iterations make no task on it until it heartbeats
    /// again. (TensorFlow never forgets a worker, so a dispatcher that outlives its jobs would
    /// hand every new iteration's tasks to the workers of jobs long gone.)
    pub lost: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: i64,
    pub name: String,
    pub dataset: String,
    /// `ProcessingModeDef.ShardingPolicy` (see [`sharding`]).
    pub sharding: i32,
    /// Round-robin reads by this many consumers.
    pub num_consumers: Option<i64>,
    /// `TargetWorkers` as the client sent it.
    pub target_workers: i32,
    pub cross_trainer_cache: bool,
}

/// One split provider of a DYNAMIC iteration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Provider {
    /// What the server needs to turn split `i` into TensorFlow's split tensor; opaque here.
    pub spec: Bytes,
    /// Splits in one repetition.
    pub splits: u64,
    /// The repetition being handed out (TF's `repetitions[i]`).
    pub repetition: i64,
    /// The next split of that repetition (TF's `indices[i]`).
    pub index: u64,
}

/// What the leader found a DYNAMIC iteration's split providers to be.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ProviderSpec {
    pub spec: Bytes,
    pub splits: u64,
}

/// A round-robin task waiting for every consumer to agree on its first round.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PendingTask {
    pub task: i64,
    pub target_round: i64,
    /// Consumers (iteration clients) that agreed to `target_round`.
    pub ready: BTreeSet<i64>,
    /// Rejections so far: each doubles how far ahead the next target round is.
    pub failures: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Iteration {
    pub id: i64,
    pub job: i64,
    /// The job's repetition this iteration is (TF's `IterationKey.repetition`).
    pub repetition: i64,
    /// DYNAMIC sharding's split providers (TF's `distributed_epoch_state`).
    pub providers: Option<Vec<Provider>>,
    /// The tasks consumers read, in order (TF's `tasks_by_iteration_`); pending ones are not here.
    pub tasks: Vec<i64>,
    pub pending: VecDeque<PendingTask>,
    pub num_clients: i64,
    /// When its last client left, in microseconds; -1 while none has.
    pub last_client_released_micros: i64,
    pub finished: bool,
    pub garbage_collected: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: i64,
    pub iteration: i64,
    pub worker: String,
    /// Round-robin: the first round read from it (0 for tasks made with their iteration).
    pub starting_round: i64,
    pub finished: bool,
}

/// The next id of each kind. TensorFlow's bases, so that ids look like TF's to its clients.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NextIds {
    pub dataset: i64,
    pub iteration: i64,
    pub client: i64,
    pub task: i64,
    pub job: i64,
}

impl Default for NextIds {
    fn default() -> Self {
        Self {
            dataset: 1000,
            iteration: 2000,
            client: 3000,
            task: 4000,
            job: 5000,
        }
    }
}

/// Everything TensorFlow's dispatcher knows. A part of `CoordState`, so of every snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TfDataState {
    pub datasets: BTreeMap<String, Dataset>,
    pub workers: BTreeMap<String, Worker>,
    pub jobs: BTreeMap<i64, Job>,
    pub jobs_by_name: BTreeMap<String, i64>,
    pub iterations: BTreeMap<i64, Iteration>,
    /// (job name, repetition) -> the iteration (the latest, if one was garbage-collected).
    pub iterations_by_key: BTreeMap<(String, i64), i64>,
    /// Every task not removed (removed round-robin tasks are forgotten, as in TF).
    pub tasks: BTreeMap<i64, Task>,
    /// Iteration client -> its iteration.
    pub clients: BTreeMap<i64, i64>,
    pub next: NextIds,
    /// Ops applied so far (a refused op changes nothing and is not counted).
    pub updates: u64,
    /// DYNAMIC splits handed out, every iteration together.
    pub splits_handed_out: u64,
}

/// One op: everything one RPC of TensorFlow's dispatcher changes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum TfDataOp {
    /// GetOrRegisterDataset: the dataset with `requested_id` if it exists (its metadata must
    /// match), else a new one under that id or the next free one.
    RegisterDataset {
        requested_id: Option<String>,
        def: Bytes,
        metadata: Bytes,
        compression: i32,
    },
    /// GetOrCreateJob: the named job (which must match) or a new one. An anonymous job is named
    /// `anonymous_job_<id>_<tag>`, `tag` picked by the leader.
    GetOrCreateJob {
        dataset: String,
        sharding: i32,
        name: Option<String>,
        anonymous_tag: u64,
        num_consumers: Option<i64>,
        target_workers: i32,
        cross_trainer_cache: bool,
    },
    /// GetOrCreateIteration: the job's iteration of `repetition` (a new one, with a task on every
    /// worker, unless it exists and was not garbage-collected), and a new client of it.
    /// `providers`: the job's split providers, for a DYNAMIC job.
    GetOrCreateIteration {
        job: i64,
        repetition: i64,
        providers: Vec<ProviderSpec>,
    },
    /// WorkerHeartbeat of a worker that is new, lost, or lacks a task of a round-robin iteration.
    /// `index`: its place in the configured worker list (static sharding). `rounds`: the latest
    /// round the clients of each round-robin iteration reported.
    WorkerHeartbeat {
        address: String,
        transfer_servers: Vec<Bytes>,
        tags: Vec<String>,
        uid: i64,
        index: Option<WorkerIndex>,
        rounds: BTreeMap<i64, i64>,
    },
    /// WorkerUpdate: these tasks produced their last element.
    FinishTasks { address: String, tasks: Vec<i64> },
    /// GetSplit: the next split (up to `max` splits, for coord-proxy's leases) of a DYNAMIC
    /// iteration's provider.
    GetSplit {
        iteration: i64,
        repetition: i64,
        provider: i64,
        max: u64,
    },
    /// ReleaseIterationClient, or the leader heard nothing from the client for its timeout.
    ReleaseClient { client: i64, time_micros: i64 },
    /// A round-robin client's heartbeat while its iteration has a pending task. `client_round`:
    /// the latest round the leader heard from this client.
    ClientHeartbeat {
        client: i64,
        current_round: Option<i64>,
        blocked_round: Option<i64>,
        client_round: i64,
    },
    /// MaybeRemoveTask, once every consumer agreed to remove the task at the same round.
    RemoveTask { task: i64 },
    /// The iteration had no clients for the collection timeout.
    GarbageCollectIteration { iteration: i64 },
    /// DisableCompressionAtRuntime.
    DisableCompression { dataset: String, disable: bool },
    /// The leader heard nothing from the worker for the worker timeout.
    WorkerLost { address: String },
}

impl fmt::Display for TfDataOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TfDataOp::RegisterDataset {
                requested_id, def, ..
            } => write!(
                f,
                "register_dataset(id={requested_id:?}, {} bytes)",
                def.len()
            ),
            TfDataOp::GetOrCreateJob {
                dataset,
                sharding,
                name,
                num_consumers,
                ..
            } => write!(
                f,
                "get_or_create_job(dataset={dataset:?}, {}, name={name:?}, consumers={num_consumers:?})",
                sharding::name(*sharding)
            ),
            TfDataOp::GetOrCreateIteration {
                job,
                repetition,
                providers,
            } => write!(
                f,
                "get_or_create_iteration(job={job}, repetition={repetition}, {} split providers)",
                providers.len()
            ),
            TfDataOp::WorkerHeartbeat { address, .. } => write!(f, "worker_heartbeat({address})"),
            TfDataOp::FinishTasks { address, tasks } => {
                write!(f, "finish_tasks({address}, {tasks:?})")
            }
            TfDataOp::GetSplit {
                iteration,
                repetition,
                provider,
                max,
            } => write!(
                f,
                "get_split(iteration={iteration}, repetition={repetition}, provider={provider}, max={max})"
            ),
            TfDataOp::ReleaseClient { client, .. } => write!(f, "release_client({client})"),
            TfDataOp::ClientHeartbeat {
                client,
                current_round,
                blocked_round,
                ..
            } => write!(
                f,
                "client_heartbeat({client}, current={current_round:?}, blocked={blocked_round:?})"
            ),
            TfDataOp::RemoveTask { task } => write!(f, "remove_task({task})"),
            TfDataOp::GarbageCollectIteration { iteration } => {
                write!(f, "garbage_collect_iteration({iteration})")
            }
            TfDataOp::DisableCompression { dataset, disable } => {
                write!(f, "disable_compression({dataset:?}, {disable})")
            }
            TfDataOp::WorkerLost { address } => write!(f, "worker_lost({address})"),
        }
    }
}

/// What an accepted op answers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum TfDataOutput {
    Dataset(String),
    Job(i64),
    /// The new client, its iteration, and the tasks made for the iteration (to push to workers).
    Iteration {
        client: i64,
        iteration: i64,
        new_tasks: Vec<i64>,
    },
    /// The splits handed out: indexes `from..from + count` of the repetition asked for;
    /// `count` 0: end of splits.
    Splits {
        from: u64,
        count: u64,
    },
    /// DisableCompressionAtRuntime: `None` when the dataset has no compression to disable.
    Compression(Option<bool>),
    Done,
}

pub type TfDataResult = Result<TfDataOutput, OpError>;

pub(crate) fn status(code: Code, message: String) -> OpError {
    OpError::Status { code, message }
}

impl TfDataState {
    /// Applies one op. Times it needs travel inside it (picked by the leader), so apply reads no
    /// clock. A refused op changes nothing.
    pub fn apply(&mut self, op: &TfDataOp) -> TfDataResult {
        let out = match op {
            TfDataOp::RegisterDataset {
                requested_id,
                def,
                metadata,
                compression,
            } => self.register_dataset(requested_id.as_deref(), def, metadata, *compression),
            TfDataOp::GetOrCreateJob {
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
            TfDataOp::GetOrCreateIteration {
                job,
                repetition,
                providers,
            } => self.get_or_create_iteration(*job, *repetition, providers),
            TfDataOp::WorkerHeartbeat {
                address,
                transfer_servers,
                tags,
                uid,
                index,
                rounds,
            } => Ok(self.worker_heartbeat(
                address,
                Worker {
                    transfer_servers: transfer_servers.clone(),
                    tags: tags.clone(),
                    uid: *uid,
                    index: *index,
                    tasks: BTreeSet::new(),
                    lost: false,
                },
                rounds,
            )),
            TfDataOp::FinishTasks { address, tasks } => self.finish_tasks(address, tasks),
            TfDataOp::GetSplit {
                iteration,
                repetition,
                provider,
                max,
            } => self.get_split(*iteration, *repetition, *provider, *max),
            TfDataOp::ReleaseClient {
                client,
                time_micros,
            } => self.release_client(*client, *time_micros),
            TfDataOp::ClientHeartbeat {
                client,
                current_round,
                blocked_round,
                client_round,
            } => self.client_heartbeat(*client, *current_round, *blocked_round, *client_round),
            TfDataOp::RemoveTask { task } => self.remove_task(*task),
            TfDataOp::GarbageCollectIteration { iteration } => {
                self.garbage_collect_iteration(*iteration)
            }
            TfDataOp::DisableCompression { dataset, disable } => {
                self.disable_compression(dataset, *disable)
            }
            TfDataOp::WorkerLost { address } => self.worker_lost(address),
        }?;
        self.updates += 1;
        Ok(out)
    }

    /// The tasks an iteration's clients read (TF's `TasksForIteration`).
    pub fn iteration_tasks<'a>(&'a self, it: &'a Iteration) -> impl Iterator<Item = &'a Task> {
        it.tasks.iter().filter_map(|t| self.tasks.get(t))
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
}

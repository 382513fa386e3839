//! The dispatcher's updates (one journal entry each) and what they answer.
//!
//! One RPC is one op, applied atomically, so a leader that dies between two of TensorFlow's
//! updates leaves no half-registered worker behind. The first twelve variants are TensorFlow's
//! RPCs and keep their place and shape, since entries are encoded by variant index and logs of
//! earlier builds hold them; coord's own protocol's follow, and every new op is appended last.
//!
//! The journal shows an op as it displays: TensorFlow's RPCs as `tfdata.<rpc>`, coord's in its
//! own words, and what both surfaces share (a client leaving or timing out, round-robin rounds)
//! in plain words.

use std::collections::BTreeMap;
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::model::{ProviderSpec, WorkerIndex};
use super::sharding;
use crate::error::OpError;

/// One dispatcher update.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DispatcherOp {
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
    /// WorkerHeartbeat of a TensorFlow worker that is new, lost, or lacks a task of a round-robin
    /// iteration. `index`: its place in the configured worker list (static sharding). `rounds`:
    /// the latest round the clients of each round-robin iteration reported.
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
    /// A client leaves its iteration (ReleaseIterationClient, ReleaseJobClient).
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
    /// A TensorFlow iteration had no clients for the collection timeout.
    GarbageCollectIteration { iteration: i64 },
    /// DisableCompressionAtRuntime.
    DisableCompression { dataset: String, disable: bool },
    /// The leader heard nothing from a TensorFlow worker for the worker timeout.
    WorkerLost { address: String },
    /// coord's GetOrRegisterDataset: the definition's dataset, unless one with the same
    /// fingerprint exists.
    RegisterDefinition {
        fingerprint: u64,
        def: Bytes,
        total_splits: Option<u64>,
    },
    /// coord's GetOrCreateJob: joins the named job of a definition (which must match) or makes a
    /// new one, read once (one iteration, repetition 0) with a task on every worker present, and
    /// adds a client to it.
    JoinJob {
        dataset: String,
        sharding: i32,
        name: Option<String>,
        anonymous_tag: u64,
        num_consumers: Option<i64>,
    },
    /// A coord data worker the dispatcher does not know, or declared dead, heartbeated.
    /// `rounds`: as in `WorkerHeartbeat`.
    RegisterDataWorker {
        address: String,
        rounds: BTreeMap<i64, i64>,
    },
    /// The leader heard nothing from the coord data worker (its `registration`) for its timeout.
    DataWorkerTimeout { address: String, registration: u64 },
    /// coord's GetSplit: a task leases up to `max` splits, reporting those it delivered.
    LeaseSplits { task: i64, done: Vec<u64>, max: u32 },
    /// coord's WorkerUpdate: splits delivered (task, split) and tasks finished.
    ReportDelivery {
        address: String,
        done: Vec<(i64, u64)>,
        completed: Vec<i64>,
    },
    /// The leader heard nothing from the client for the client timeout.
    ClientTimeout { client: i64, time_micros: i64 },
    /// A job of a definition had no clients for the collection timeout.
    CollectJob { iteration: i64 },
}

impl fmt::Display for DispatcherOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use DispatcherOp::*;
        match self {
            RegisterDataset {
                requested_id, def, ..
            } => write!(
                f,
                "tfdata.register_dataset(id={requested_id:?}, {} bytes)",
                def.len()
            ),
            GetOrCreateJob {
                dataset,
                sharding,
                name,
                num_consumers,
                ..
            } => write!(
                f,
                "tfdata.get_or_create_job(dataset={dataset:?}, {}, name={name:?}, consumers={num_consumers:?})",
                sharding::name(*sharding)
            ),
            GetOrCreateIteration {
                job,
                repetition,
                providers,
            } => write!(
                f,
                "tfdata.get_or_create_iteration(job={job}, repetition={repetition}, {} split providers)",
                providers.len()
            ),
            WorkerHeartbeat { address, .. } => write!(f, "tfdata.worker_heartbeat({address})"),
            FinishTasks { address, tasks } => {
                write!(f, "tfdata.finish_tasks({address}, {tasks:?})")
            }
            GetSplit {
                iteration,
                repetition,
                provider,
                max,
            } => write!(
                f,
                "tfdata.get_split(iteration={iteration}, repetition={repetition}, provider={provider}, max={max})"
            ),
            ReleaseClient { client, .. } => write!(f, "release_client({client})"),
            ClientHeartbeat {
                client,
                current_round,
                blocked_round,
                ..
            } => write!(
                f,
                "client_rounds({client}, current={current_round:?}, blocked={blocked_round:?})"
            ),
            RemoveTask { task } => write!(f, "tfdata.remove_task({task})"),
            GarbageCollectIteration { iteration } => {
                write!(f, "tfdata.garbage_collect_iteration({iteration})")
            }
            DisableCompression { dataset, disable } => {
                write!(f, "tfdata.disable_compression({dataset:?}, {disable})")
            }
            WorkerLost { address } => write!(f, "tfdata.worker_lost({address})"),
            RegisterDefinition {
                fingerprint,
                def,
                total_splits,
            } => write!(
                f,
                "register_dataset(fingerprint={fingerprint:016x}, {} bytes, splits={})",
                def.len(),
                total_splits.map_or("infinite".to_string(), |n| n.to_string())
            ),
            JoinJob {
                dataset,
                sharding,
                name,
                num_consumers,
                ..
            } => write!(
                f,
                "get_or_create_job(dataset={dataset}, {}, name={name:?}, consumers={num_consumers:?})",
                sharding::name(*sharding)
            ),
            RegisterDataWorker { address, .. } => write!(f, "register_worker({address})"),
            DataWorkerTimeout {
                address,
                registration,
            } => write!(f, "worker_timeout({address}, worker={registration})"),
            LeaseSplits { task, done, max } => {
                write!(f, "get_split(task={task}, done={done:?}, max={max})")
            }
            ReportDelivery {
                address,
                done,
                completed,
            } => write!(
                f,
                "worker_update({address}, {} splits done, tasks completed {completed:?})",
                done.len()
            ),
            ClientTimeout { client, .. } => write!(f, "client_timeout({client})"),
            CollectJob { iteration } => write!(f, "collect_job({iteration})"),
        }
    }
}

/// What a lease of splits answers (coord's GetSplit).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// One or more splits, now leased to the task.
    Splits(Vec<u64>),
    /// Nothing now, but leases held by other tasks may come back.
    Retry,
    EndOfSplits,
}

/// What an accepted update answers. The first six variants are what TensorFlow's RPCs answered
/// in earlier builds too (results are kept in the session table, so their encoding stays).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DispatcherOutput {
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
    /// A definition's dataset; `created` is false when its fingerprint was known.
    Definition {
        id: String,
        created: bool,
    },
    /// The worker's registration.
    Registered(u64),
    Lease(LeaseAnswer),
}

pub type DispatcherResult = Result<DispatcherOutput, OpError>;

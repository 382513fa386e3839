//! The tf.data dispatcher's state (TensorFlow's `DataServiceDispatcherImpl`), replicated: the Raft
//! log is its journal.
//!
//! TensorFlow's dispatcher writes every `Update` to a local journal and replays all of it on
//! restart. Here each update is one [`DispatchOp`] in the Raft log, applied by the same
//! deterministic `apply` on every replica, and a snapshot holds the state itself, so a restart
//! costs what the state weighs, not what its history weighs.
//!
//! Ids are counters in the state, so every replica hands out the same ones. What TF keeps in
//! memory stays in the leader's memory here too (heartbeat times, round-robin rounds); the leader
//! passes what an update needs of it (the round a new pending task aims at) inside the op.
//!
//! Beyond TF: a split handed to a worker is *leased* until the worker says its elements were all
//! delivered. When the worker is declared dead its leased splits are handed out again
//! (at-least-once; elements keep their (split, offset) identity so consumers drop duplicates).
//!
//! - [`jobs`]: datasets, jobs, clients and the tasks made for them.
//! - [`workers`]: worker registration, death and task completion.
//! - [`splits`]: DYNAMIC sharding's split provider with leases.
//! - [`rounds`]: round-robin reads: adding a task mid-job (the pending-task protocol).

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

pub use splits::SplitAnswer;

/// How a job's data is divided among its workers (TF's `ProcessingModeDef`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every worker produces the whole dataset.
    Off,
    /// Splits on demand from the dispatcher (distributed epoch).
    Dynamic,
    /// Static: worker i of n reads splits i, i+n, ...
    File,
    /// Static: worker i of n reads records i, i+n, ...
    Data,
}

impl Mode {
    pub fn is_static(self) -> bool {
        matches!(self, Mode::File | Mode::Data)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Dataset {
    pub fingerprint: u64,
    /// The encoded definition (coord.dispatcher.DatasetDef), validated by the leader.
    pub def: Bytes,
    /// Splits in all epochs; `None` for a dataset that repeats forever.
    pub total_splits: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// A new number at every registration: a worker declared dead and back is a new worker.
    pub id: u64,
    pub alive: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    pub name: Option<String>,
    pub dataset: u64,
    pub mode: Mode,
    /// Round-robin reads by this many consumers.
    pub num_consumers: Option<u64>,
    /// Static sharding: the number of shards, fixed when the job was made.
    pub num_shards: u64,
    /// Every task ever made for the job, in order.
    pub tasks: Vec<u64>,
    pub clients: BTreeSet<u64>,
    /// When the last client left (for garbage collection); `None` while it has clients.
    pub idle_since_ms: Option<u64>,
    pub finished: bool,
    pub garbage_collected: bool,
    pub splits: splits::SplitProvider,
    /// Round-robin tasks waiting for every consumer to agree on their first round.
    pub pending: VecDeque<rounds::PendingTask>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: u64,
    pub job: u64,
    pub worker: String,
    /// The worker registration the task was made for.
    pub worker_id: u64,
    pub shard_index: u64,
    /// Round-robin: the first round read from this task; `None` while it is pending.
    pub starting_round: Option<i64>,
    /// The task produced its last element.
    pub finished: bool,
    /// Its worker was declared dead (or its job collected): consumers stop reading it.
    pub removed: bool,
}

/// Everything the dispatcher knows. A part of `CoordState`, so of every snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatcherState {
    pub datasets: BTreeMap<u64, Dataset>,
    pub by_fingerprint: BTreeMap<u64, u64>,
    pub workers: BTreeMap<String, Worker>,
    pub jobs: BTreeMap<u64, Job>,
    pub named_jobs: BTreeMap<String, u64>,
    pub tasks: BTreeMap<u64, Task>,
    /// Client id -> its job.
    pub clients: BTreeMap<u64, u64>,
    /// The last id handed out (datasets, jobs, tasks, clients and workers share the counter).
    pub last_id: u64,
    /// Journal updates applied so far.
    pub updates: u64,
}

/// One dispatcher update: one journal entry.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DispatchOp {
    /// Registers the dataset unless one with the fingerprint exists.
    RegisterDataset {
        fingerprint: u64,
        def: Bytes,
        total_splits: Option<u64>,
    },
    /// Joins the named job (which must match) or makes a new one, with a task on every live
    /// worker, and adds a client to it.
    GetOrCreateJob {
        dataset: u64,
        mode: Mode,
        name: Option<String>,
        num_consumers: Option<u64>,
    },
    ReleaseClient {
        client: u64,
    },
    /// The leader heard nothing from the client for its timeout.
    ClientTimeout {
        client: u64,
    },
    /// A worker the dispatcher does not know (or declared dead) heartbeated. `rounds` is the
    /// leader's latest known round of each round-robin job.
    RegisterWorker {
        address: String,
        rounds: BTreeMap<u64, i64>,
    },
    /// The leader heard nothing from the worker (registration `worker_id`) for its timeout.
    WorkerTimeout {
        address: String,
        worker_id: u64,
    },
    /// A task asks for its next split, reporting the splits it has delivered.
    GetSplit {
        task: u64,
        done: Vec<u64>,
        /// Lease up to this many splits (at least one).
        max: u32,
    },
    /// Splits delivered and tasks finished, reported by a worker.
    WorkerUpdate {
        address: String,
        done: Vec<(u64, u64)>,
        completed: Vec<u64>,
    },
    /// A round-robin consumer's heartbeat while its job has a pending task.
    ClientRounds {
        client: u64,
        current_round: Option<i64>,
        blocked_round: Option<i64>,
    },
    /// The job had no clients for the collection timeout.
    CollectJob {
        job: u64,
    },
}

impl fmt::Display for DispatchOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DispatchOp::RegisterDataset {
                fingerprint,
                total_splits,
                def,
            } => write!(
                f,
                "register_dataset(fingerprint={fingerprint:016x}, {} bytes, splits={})",
                def.len(),
                total_splits.map_or("infinite".to_string(), |n| n.to_string())
            ),
            DispatchOp::GetOrCreateJob {
                dataset,
                mode,
                name,
                num_consumers,
            } => write!(
                f,
                "get_or_create_job(dataset={dataset}, {mode:?}, name={name:?}, consumers={num_consumers:?})"
            ),
            DispatchOp::ReleaseClient { client } => write!(f, "release_client({client})"),
            DispatchOp::ClientTimeout { client } => write!(f, "client_timeout({client})"),
            DispatchOp::RegisterWorker { address, .. } => write!(f, "register_worker({address})"),
            DispatchOp::WorkerTimeout { address, worker_id } => {
                write!(f, "worker_timeout({address}, worker={worker_id})")
            }
            DispatchOp::GetSplit { task, done, max } => {
                write!(f, "get_split(task={task}, done={done:?}, max={max})")
            }
            DispatchOp::WorkerUpdate {
                address,
                done,
                completed,
            } => write!(
                f,
                "worker_update({address}, {} splits done, tasks completed {completed:?})",
                done.len()
            ),
            DispatchOp::ClientRounds {
                client,
                current_round,
                blocked_round,
            } => write!(
                f,
                "client_rounds({client}, current={current_round:?}, blocked={blocked_round:?})"
            ),
            DispatchOp::CollectJob { job } => write!(f, "collect_job({job})"),
        }
    }
}

/// What a dispatcher update returns.
///
/// The dispatcher returns its own result rather than a command's, so that it needs nothing from the
/// command layer: the state's apply wraps it in `Output::Dispatch`.
pub type DispatchResult = Result<DispatchOutput, OpError>;

/// What an accepted dispatcher update answers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DispatchOutput {
    Dataset {
        id: u64,
        created: bool,
    },
    Job {
        job: u64,
        client: u64,
    },
    Worker {
        id: u64,
    },
    Split(SplitAnswer),
    /// Round-robin: the round the consumer must not start yet.
    Block(Option<i64>),
    Done,
}

pub(crate) fn status(code: Code, message: String) -> OpError {
    OpError::Status { code, message }
}

pub(crate) fn not_found(what: &str, id: u64) -> OpError {
    status(
        Code::NotFound,
        format!("{what} {id} is not known to the dispatcher"),
    )
}

impl DispatcherState {
    fn next_id(&mut self) -> u64 {
        self.last_id += 1;
        self.last_id
    }

    /// Applies one update at `now_ms` (the leader's clock when it proposed). A refused update
    /// changes nothing.
    pub fn apply(&mut self, op: &DispatchOp, now_ms: u64) -> DispatchResult {
        let out = match op {
            DispatchOp::RegisterDataset {
                fingerprint,
                def,
                total_splits,
            } => Ok(self.register_dataset(*fingerprint, def, *total_splits)),
            DispatchOp::GetOrCreateJob {
                dataset,
                mode,
                name,
                num_consumers,
            } => self.get_or_create_job(*dataset, *mode, name.as_deref(), *num_consumers),
            DispatchOp::ReleaseClient { client } | DispatchOp::ClientTimeout { client } => {
                self.release_client(*client, now_ms)
            }
            DispatchOp::RegisterWorker { address, rounds } => {
                Ok(self.register_worker(address, rounds))
            }
            DispatchOp::WorkerTimeout { address, worker_id } => {
                Ok(self.worker_timeout(address, *worker_id))
            }
            DispatchOp::GetSplit { task, done, max } => self.get_split(*task, done, *max),
            DispatchOp::WorkerUpdate {
                address,
                done,
                completed,
            } => self.worker_update(address, done, completed),
            DispatchOp::ClientRounds {
                client,
                current_round,
                blocked_round,
            } => self.client_rounds(*client, *current_round, *blocked_round),
            DispatchOp::CollectJob { job } => self.collect_job(*job),
        }?;
        self.updates += 1;
        Ok(out)
    }

    /// The job's tasks consumers read: not removed, and (round-robin) no longer pending.
    pub fn visible_tasks<'a>(&'a self, job: &'a Job) -> impl Iterator<Item = &'a Task> + 'a {
        job.tasks
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .filter(|t| !t.removed)
            .filter(move |t| job.num_consumers.is_none() || t.starting_round.is_some())
    }
}

//! coord's own dispatcher of before, as snapshots of formats 1 to 5 and logs of those builds hold
//! it: its records, its updates and their answers (answers are kept in the session table). Read
//! only; its ids came from one counter shared by every kind.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Its processing modes; the same numbers as TensorFlow's sharding policies OFF to DATA.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Off,
    Dynamic,
    File,
    Data,
}

impl Mode {
    pub fn sharding(self) -> i32 {
        use crate::dispatcher::sharding;
        match self {
            Mode::Off => sharding::OFF,
            Mode::Dynamic => sharding::DYNAMIC,
            Mode::File => sharding::FILE,
            Mode::Data => sharding::DATA,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Dataset {
    pub fingerprint: u64,
    pub def: Bytes,
    pub total_splits: Option<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    pub id: u64,
    pub alive: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SplitProvider {
    pub next: u64,
    pub total: Option<u64>,
    pub leased: BTreeMap<u64, u64>,
    pub reissue: BTreeSet<u64>,
    pub delivered: u64,
    pub reissued: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PendingTask {
    pub task: u64,
    pub target_round: i64,
    pub delta: i64,
    pub ready: BTreeSet<u64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    pub name: Option<String>,
    pub dataset: u64,
    pub mode: Mode,
    pub num_consumers: Option<u64>,
    pub num_shards: u64,
    pub tasks: Vec<u64>,
    pub clients: BTreeSet<u64>,
    pub idle_since_ms: Option<u64>,
    pub finished: bool,
    pub garbage_collected: bool,
    pub splits: SplitProvider,
    pub pending: VecDeque<PendingTask>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: u64,
    pub job: u64,
    pub worker: String,
    pub worker_id: u64,
    pub shard_index: u64,
    pub starting_round: Option<i64>,
    pub finished: bool,
    pub removed: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatcherState {
    pub datasets: BTreeMap<u64, Dataset>,
    pub by_fingerprint: BTreeMap<u64, u64>,
    pub workers: BTreeMap<String, Worker>,
    pub jobs: BTreeMap<u64, Job>,
    pub named_jobs: BTreeMap<String, u64>,
    pub tasks: BTreeMap<u64, Task>,
    pub clients: BTreeMap<u64, u64>,
    pub last_id: u64,
    pub updates: u64,
}

/// One of its updates, as its log entries hold them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DispatchOp {
    RegisterDataset {
        fingerprint: u64,
        def: Bytes,
        total_splits: Option<u64>,
    },
    GetOrCreateJob {
        dataset: u64,
        mode: Mode,
        name: Option<String>,
        num_consumers: Option<u64>,
    },
    ReleaseClient {
        client: u64,
    },
    ClientTimeout {
        client: u64,
    },
    RegisterWorker {
        address: String,
        rounds: BTreeMap<u64, i64>,
    },
    WorkerTimeout {
        address: String,
        worker_id: u64,
    },
    GetSplit {
        task: u64,
        done: Vec<u64>,
        max: u32,
    },
    WorkerUpdate {
        address: String,
        done: Vec<(u64, u64)>,
        completed: Vec<u64>,
    },
    ClientRounds {
        client: u64,
        current_round: Option<i64>,
        blocked_round: Option<i64>,
    },
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

/// What its GetSplit answered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum SplitAnswer {
    Splits(Vec<u64>),
    Retry,
    EndOfSplits,
}

/// What its updates answered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DispatchOutput {
    Dataset { id: u64, created: bool },
    Job { job: u64, client: u64 },
    Worker { id: u64 },
    Split(SplitAnswer),
    Block(Option<i64>),
    Done,
}

//! The dispatcher's records: TensorFlow's model (`DataServiceDispatcherImpl`'s datasets, jobs,
//! iterations, tasks, workers and clients), with what coord's own data workers add to it.
//!
//! TensorFlow's clients read the names, ids and codes of this model, so it is TensorFlow's. What
//! coord adds is data, not a second model: a dataset is either a TensorFlow graph or a coord
//! definition ([`DatasetSource`]); a worker either reports each split's delivery (coord's data
//! workers) or does not (TensorFlow's, [`Worker::reports_delivery`]); a split provider of a
//! definition keeps [`Leases`], so a split handed to a worker that dies goes out again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// `DataServiceMetadata.Compression`'s SNAPPY: the only compression that can be turned off.
pub const COMPRESSION_SNAPPY: i32 = 2;

/// What a dataset is made of, which says which workers can produce it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DatasetSource {
    /// TensorFlow's `DatasetDef` (a graph), encoded as the client sent it; produced by
    /// TensorFlow's workers, handed to them in their `TaskDef`s.
    Graph(Bytes),
    /// coord's `DatasetDef` (integer ranges, record files, a few ops), encoded; produced by
    /// coord's data workers. Registration dedupes by `fingerprint`.
    Definition {
        fingerprint: u64,
        def: Bytes,
        /// Splits in all epochs; `None` for a definition that repeats forever.
        total_splits: Option<u64>,
    },
}

impl DatasetSource {
    /// Whether the dataset is produced by workers that report delivery (coord's data workers).
    pub fn is_definition(&self) -> bool {
        matches!(self, DatasetSource::Definition { .. })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Dataset {
    pub source: DatasetSource,
    /// The client's `DataServiceMetadata`, encoded (empty for a coord definition).
    pub metadata: Bytes,
    /// The metadata's compression (`DataServiceMetadata.Compression`).
    pub compression: i32,
    /// DisableCompressionAtRuntime's decision, once made (the first client's answer holds).
    pub compression_disabled: Option<bool>,
}

/// A worker's position in the configured worker list (TensorFlow's static sharding).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerIndex {
    pub index: i64,
    /// The length of the configured list: TF's `TaskDef.num_workers`.
    pub of: i64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    /// Its `DataTransferServerInfo`s, each encoded, as it sent them (TensorFlow's workers).
    pub transfer_servers: Vec<Bytes>,
    pub tags: Vec<String>,
    pub uid: i64,
    /// Where it stands in the configured worker list, when one is configured.
    pub index: Option<WorkerIndex>,
    /// The tasks assigned to it and not finished (TF's `tasks_by_worker_`): pending ones too.
    pub tasks: BTreeSet<i64>,
    /// Silent past its worker timeout. A lost TensorFlow worker keeps its tasks (as in TF, where
    /// a worker is never forgotten) but new iterations make none on it; a lost worker that
    /// reports delivery is dead: its tasks are removed and its leased splits go out again.
    pub lost: bool,
    /// coord's data workers report every split whose elements they delivered, so their splits
    /// are leased; TensorFlow's report nothing of the kind.
    pub reports_delivery: bool,
    /// Which registration of this address it is. A delivery-reporting worker declared dead and
    /// back is a new registration (with new tasks); TensorFlow's keep their first.
    pub registration: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: i64,
    pub name: String,
    /// The client named no job: `name` was made up (`anonymous_job_<id>_<tag>`, as TF does).
    pub anonymous: bool,
    pub dataset: String,
    /// `ProcessingModeDef.ShardingPolicy` (see [`super::sharding`]).
    pub sharding: i32,
    /// Round-robin reads by this many consumers.
    pub num_consumers: Option<i64>,
    /// `TargetWorkers` as the client sent it.
    pub target_workers: i32,
    pub cross_trainer_cache: bool,
}

/// A split handed out is leased until its worker reports its elements delivered; the leases of a
/// worker declared dead go back to be handed out first. Only providers whose workers report
/// delivery keep them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Leases {
    /// Split -> the task it is leased to.
    pub leased: BTreeMap<u64, i64>,
    /// Splits whose worker died before delivering them.
    pub reissue: BTreeSet<u64>,
    /// Splits delivered.
    pub delivered: u64,
    /// Splits handed out again after their worker died.
    pub reissued: u64,
}

/// One split provider of a DYNAMIC iteration: a position over a known number of splits, so
/// split `i` is a pure function of the provider's spec and `i`, and restoring a provider is O(1)
/// where TensorFlow fast-forwards it one `GetNext` per split already handed out.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Provider {
    /// What the server needs to turn split `i` into TensorFlow's split tensor; opaque here
    /// (empty for a coord definition: its splits are indexes into the definition).
    pub spec: Bytes,
    /// Splits in one repetition ([`ENDLESS`] for a definition that repeats forever).
    pub splits: u64,
    /// The repetition being handed out (TF's `repetitions[i]`). A coord definition numbers its
    /// splits across epochs and stays at repetition 0.
    pub repetition: i64,
    /// The next split of that repetition (TF's `indices[i]`).
    pub index: u64,
    /// Present when the iteration's workers report delivery.
    pub leases: Option<Leases>,
}

/// The split count of a provider that never ends: more than can ever be handed out.
pub const ENDLESS: u64 = u64::MAX;

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
    /// The tasks consumers read, in order (TF's `tasks_by_iteration_`); pending ones are not
    /// here, removed ones stay (marked) so that a late call about them is answered precisely.
    pub tasks: Vec<i64>,
    pub pending: VecDeque<PendingTask>,
    pub num_clients: i64,
    /// When its last client left, in microseconds; -1 while none has.
    pub last_client_released_micros: i64,
    /// Static sharding of a coord definition: the shards, one per worker present when the
    /// iteration was made (workers that come later get no task of it). 0 otherwise.
    pub num_shards: u64,
    pub finished: bool,
    pub garbage_collected: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: i64,
    pub iteration: i64,
    pub worker: String,
    /// The worker registration the task was made for.
    pub registration: u64,
    /// Round-robin: the first round read from it (0 for tasks made with their iteration).
    pub starting_round: i64,
    /// Static sharding of a coord definition: this task's shard of the iteration's `num_shards`.
    pub shard_index: u64,
    pub finished: bool,
    /// Its worker was declared dead: consumers stop reading it, its splits went to others.
    pub removed: bool,
}

/// The next id of each kind. TensorFlow's bases, so that ids look like TF's to its clients.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct NextIds {
    pub dataset: i64,
    pub iteration: i64,
    pub client: i64,
    pub task: i64,
    pub job: i64,
    /// Worker registrations.
    pub registration: u64,
}

impl Default for NextIds {
    fn default() -> Self {
        Self {
            dataset: 1000,
            iteration: 2000,
            client: 3000,
            task: 4000,
            job: 5000,
            registration: 1,
        }
    }
}

/// What is left of coord's dispatcher of before the two became one (see `legacy`): its ids came
/// from one counter shared by every kind, and kept their values here.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct LegacyIds {
    /// The last id that dispatcher handed out: its updates still in the log number on from it.
    pub last_id: u64,
    /// Its ids that another object already held, and what they became.
    pub remap: BTreeMap<u64, i64>,
}

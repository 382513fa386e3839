//! TensorFlow's dispatcher state as snapshots of formats 4 and 5 hold it: the shape of today's
//! model before coord's own dispatcher joined it. Read only, then turned into today's records
//! ([`super::convert`]); the records' meaning did not change.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::dispatcher::{PendingTask, WorkerIndex};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Dataset {
    pub def: Bytes,
    pub metadata: Bytes,
    pub compression: i32,
    pub compression_disabled: Option<bool>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    pub transfer_servers: Vec<Bytes>,
    pub tags: Vec<String>,
    pub uid: i64,
    pub index: Option<WorkerIndex>,
    pub tasks: BTreeSet<i64>,
    pub lost: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Job {
    pub id: i64,
    pub name: String,
    pub dataset: String,
    pub sharding: i32,
    pub num_consumers: Option<i64>,
    pub target_workers: i32,
    pub cross_trainer_cache: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Provider {
    pub spec: Bytes,
    pub splits: u64,
    pub repetition: i64,
    pub index: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Iteration {
    pub id: i64,
    pub job: i64,
    pub repetition: i64,
    pub providers: Option<Vec<Provider>>,
    pub tasks: Vec<i64>,
    pub pending: VecDeque<PendingTask>,
    pub num_clients: i64,
    pub last_client_released_micros: i64,
    pub finished: bool,
    pub garbage_collected: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub id: i64,
    pub iteration: i64,
    pub worker: String,
    pub starting_round: i64,
    pub finished: bool,
}

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
        let today = crate::dispatcher::NextIds::default();
        Self {
            dataset: today.dataset,
            iteration: today.iteration,
            client: today.client,
            task: today.task,
            job: today.job,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TfDataState {
    pub datasets: BTreeMap<String, Dataset>,
    pub workers: BTreeMap<String, Worker>,
    pub jobs: BTreeMap<i64, Job>,
    pub jobs_by_name: BTreeMap<String, i64>,
    pub iterations: BTreeMap<i64, Iteration>,
    pub iterations_by_key: BTreeMap<(String, i64), i64>,
    pub tasks: BTreeMap<i64, Task>,
    pub clients: BTreeMap<i64, i64>,
    pub next: NextIds,
    pub updates: u64,
    pub splits_handed_out: u64,
}

//! TensorFlow's tf.data dispatcher (`tensorflow.data.DispatcherService`), served by the leader
//! over the replicated state of `coord_raft_store::tfdata`: every change is one Raft command (the
//! log is the journal), reads wait for the read index and read the applied state.
//!
//! Each method does what TensorFlow 2.21's `DataServiceDispatcherImpl` does for that RPC, with
//! TF's codes and messages; what differs is said where it differs (a dataset whose splits cannot
//! be produced is refused when its DYNAMIC job is made; a refused iteration writes nothing).
//!
//! - this module: datasets and jobs; [`clients`]: iterations and their clients; [`workers`]:
//!   worker heartbeats and updates; [`splits`]: GetSplit, and DYNAMIC split providers from the
//!   dataset's graph.
//! - [`memory`]: the leader's soft state (client heartbeats, rounds, task removal).
//! - [`remover`]: consumers' agreement to remove a round-robin task.
//! - [`wire`]: `TaskDef`s and `TaskInfo`s from the state.
//! - [`push`]: new tasks pushed to workers (`ProcessTask`).
//! - [`timers`]: client timeouts and iteration garbage collection.
//! - [`report`]: iterations and workers for operators; [`metrics`]: their part of `/metrics`.

mod clients;
pub mod memory;
pub mod metrics;
pub mod push;
pub mod remover;
mod report;
pub mod splits;
pub mod timers;
pub mod wire;
mod workers;

use std::sync::Arc;

use bytes::Bytes;
use coord_proto::tensorflow::data as pb;
use coord_raft_store::state::Code;
use coord_raft_store::storage::StateReader;
use coord_raft_store::tfdata::{sharding, TfDataOp, TfDataOutput, TfDataState};
use coord_raft_store::{Command, Op, Output, RequestId};
use prost::Message;

use crate::error::CoordError;
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;
use memory::Memory;

/// `kDataServiceVersion` of TensorFlow 2.21: clients refuse a dispatcher of another version.
pub const DATA_SERVICE_VERSION: i64 = 9;
/// The largest dataset definition accepted: it travels in the Raft log and in every TaskDef.
pub const MAX_DATASET_BYTES: usize = 16 << 20;

/// The dispatcher's settings (flags of the coordinator).
#[derive(Clone, Debug, Default)]
pub struct TfDataConfig {
    /// TensorFlow's `DispatcherConfig.worker_addresses`: the fixed worker list static sharding
    /// needs (`host:port`, or `host:%port%` for any port on that host).
    pub worker_addresses: Vec<String>,
    pub client_timeout_ms: u64,
    pub iteration_gc_timeout_ms: u64,
    /// A worker silent this long gets no task of new iterations until it heartbeats again.
    pub worker_timeout_ms: u64,
}

impl TfDataConfig {
    pub fn from_args(args: &crate::ops::config::Args) -> Self {
        Self {
            worker_addresses: args.tfdata_worker_addresses.clone(),
            client_timeout_ms: args.dispatcher_client_timeout_ms,
            iteration_gc_timeout_ms: args.dispatcher_job_gc_timeout_ms,
            worker_timeout_ms: args.tfdata_worker_timeout_ms,
        }
    }
}

pub struct TfDataCore {
    pub proposer: Proposer,
    pub read_index: ReadIndex,
    pub reader: StateReader,
    pub memory: Arc<Memory>,
    pub push: push::WorkerPush,
    pub config: TfDataConfig,
}

fn status(code: Code, message: String) -> CoordError {
    CoordError::status(code, message)
}

fn unexpected(what: &str, out: &Output) -> CoordError {
    CoordError::Internal(format!("{what} returned {out:?}"))
}

pub fn now_micros() -> i64 {
    i64::try_from(crate::serve::proposer::now_ms())
        .unwrap_or(i64::MAX)
        .saturating_mul(1000)
}

impl TfDataCore {
    async fn commit(
        &self,
        request: Option<RequestId>,
        op: TfDataOp,
    ) -> Result<TfDataOutput, CoordError> {
        let what = op.to_string();
        match self
            .proposer
            .propose(Command {
                request,
                op: Op::TfData(op),
            })
            .await??
        {
            Output::TfData(o) => Ok(o),
            other => Err(unexpected(&what, &other)),
        }
    }

    /// Reads the applied state after a linearizable read barrier.
    async fn read<T>(&self, f: impl FnOnce(&TfDataState) -> T) -> Result<T, CoordError> {
        self.read_index.linearize().await?;
        Ok(self.applied(f))
    }

    /// Reads the applied state as it is (after a commit of this leader's, it includes it).
    fn applied<T>(&self, f: impl FnOnce(&TfDataState) -> T) -> T {
        self.reader.read(|a| f(&a.state.tfdata))
    }

    pub async fn register_dataset(
        &self,
        id: Option<RequestId>,
        req: pb::GetOrRegisterDatasetRequest,
    ) -> Result<pb::GetOrRegisterDatasetResponse, CoordError> {
        let def = req.dataset.unwrap_or_default().encode_to_vec();
        if def.len() > MAX_DATASET_BYTES {
            return Err(CoordError::ResourceExhausted(format!(
                "the dataset's definition is {} bytes, over the {MAX_DATASET_BYTES}-byte limit \
                 of this dispatcher (it is replicated in the Raft log and sent in every task)",
                def.len()
            )));
        }
        let metadata = req.metadata.unwrap_or_default();
        let op = TfDataOp::RegisterDataset {
            requested_id: req
                .optional_dataset_id
                .map(|pb::get_or_register_dataset_request::OptionalDatasetId::DatasetId(d)| d),
            def: def.into(),
            compression: metadata.compression,
            metadata: metadata.encode_to_vec().into(),
        };
        match self.commit(id, op).await? {
            TfDataOutput::Dataset(dataset_id) => {
                Ok(pb::GetOrRegisterDatasetResponse { dataset_id })
            }
            other => Err(unexpected("register_dataset", &Output::TfData(other))),
        }
    }

    /// The bytes stored for a dataset: its definition or its metadata.
    async fn dataset_bytes(
        &self,
        dataset: &str,
        field: fn(&coord_raft_store::tfdata::Dataset) -> &Bytes,
    ) -> Result<Bytes, CoordError> {
        self.read(|s| s.datasets.get(dataset).map(|d| field(d).clone()))
            .await?
            .ok_or_else(|| status(Code::NotFound, format!("Dataset id {dataset} not found")))
    }

    pub async fn metadata(&self, dataset: &str) -> Result<pb::DataServiceMetadata, CoordError> {
        let bytes = self.dataset_bytes(dataset, |d| &d.metadata).await?;
        pb::DataServiceMetadata::decode(bytes).map_err(|e| {
            CoordError::Internal(format!(
                "stored metadata of dataset {dataset} does not decode: {e}"
            ))
        })
    }

    pub async fn dataset_def(&self, dataset: &str) -> Result<pb::DatasetDef, CoordError> {
        let bytes = self.dataset_bytes(dataset, |d| &d.def).await?;
        pb::DatasetDef::decode(bytes).map_err(|e| {
            CoordError::Internal(format!("stored dataset {dataset} does not decode: {e}"))
        })
    }

    pub async fn get_or_create_job(
        &self,
        id: Option<RequestId>,
        req: pb::GetOrCreateJobRequest,
    ) -> Result<pb::GetOrCreateJobResponse, CoordError> {
        let policy = req
            .processing_mode_def
            .map_or(sharding::OFF, |p| p.sharding_policy);
        let name = req
            .optional_job_name
            .map(|pb::get_or_create_job_request::OptionalJobName::JobName(n)| n);
        let exists = match &name {
            Some(n) => self.read(|s| s.jobs_by_name.contains_key(n)).await?,
            None => false,
        };
        if !exists {
            // Refused before anything is written, naming the op at fault.
            if policy == sharding::DYNAMIC {
                self.dynamic_providers(&req.dataset_id).await?;
            }
        }
        let op = TfDataOp::GetOrCreateJob {
            dataset: req.dataset_id,
            sharding: policy,
            name,
            anonymous_tag: rand::random::<u64>(),
            num_consumers: req
                .optional_num_consumers
                .map(|pb::get_or_create_job_request::OptionalNumConsumers::NumConsumers(n)| n),
            target_workers: req.target_workers,
            cross_trainer_cache: req.use_cross_trainer_cache,
        };
        match self.commit(id, op).await? {
            TfDataOutput::Job(job_id) => Ok(pb::GetOrCreateJobResponse { job_id }),
            other => Err(unexpected("get_or_create_job", &Output::TfData(other))),
        }
    }

    pub async fn workers(&self) -> Result<pb::GetWorkersResponse, CoordError> {
        self.read(|s| pb::GetWorkersResponse {
            workers: s
                .workers
                .keys()
                .map(|address| pb::WorkerInfo {
                    address: address.clone(),
                })
                .collect(),
        })
        .await
    }

    pub async fn disable_compression(
        &self,
        id: Option<RequestId>,
        req: pb::DisableCompressionAtRuntimeRequest,
    ) -> Result<pb::DisableCompressionAtRuntimeResponse, CoordError> {
        use pb::disable_compression_at_runtime_response::Decision;
        let answer = |decided: Option<bool>| pb::DisableCompressionAtRuntimeResponse {
            decision: Some(match decided {
                Some(d) => Decision::CompressionDisabledAtRuntime(d),
                None => Decision::NoCompressionToDisable(true),
            }),
        };
        // Every client asks; once decided (or with nothing to decide) the answer is a read.
        let known = self
            .read(|s| {
                s.datasets.get(&req.dataset_id).map(|d| {
                    if d.compression != coord_raft_store::tfdata::COMPRESSION_SNAPPY {
                        Some(None)
                    } else {
                        d.compression_disabled.map(Some)
                    }
                })
            })
            .await?;
        match known {
            None => {
                return Err(status(
                    Code::NotFound,
                    format!("Dataset id {} not found", req.dataset_id),
                ))
            }
            Some(Some(decided)) => return Ok(answer(decided)),
            Some(None) => {}
        }
        let op = TfDataOp::DisableCompression {
            dataset: req.dataset_id,
            disable: req.disable_compression_at_runtime,
        };
        match self.commit(id, op).await? {
            TfDataOutput::Compression(decided) => Ok(answer(decided)),
            other => Err(unexpected("disable_compression", &Output::TfData(other))),
        }
    }
}

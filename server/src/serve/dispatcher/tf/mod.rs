//! TensorFlow's surface of the dispatcher (`tensorflow.data.DispatcherService`, as TensorFlow
//! 2.21's workers and `distribute()` clients speak it): a thin adapter over the one dispatcher
//! state, translating TensorFlow's messages into the state's ops and its records into TF's
//! answers.
//!
//! Each method does what TensorFlow 2.21's `DataServiceDispatcherImpl` does for that RPC, with
//! TF's codes and messages; what differs is said where it differs (a dataset whose splits cannot
//! be produced is refused when its DYNAMIC job is made; a refused iteration writes nothing).
//!
//! - this module: datasets and jobs; [`clients`]: iterations and their clients; [`workers`]:
//!   worker heartbeats and updates; [`splits`]: GetSplit, and DYNAMIC split providers from the
//!   dataset's graph; [`wire`]: `TaskDef`s and `TaskInfo`s from the state.

mod clients;
pub mod splits;
pub mod wire;
mod workers;

use bytes::Bytes;
use coord_proto::tensorflow::data as pb;
use coord_raft_store::dispatcher::{sharding, DatasetSource, DispatcherOp, DispatcherOutput};
use coord_raft_store::state::Code;
use coord_raft_store::{Output, RequestId};
use prost::Message;

use super::{unexpected, DispatcherCore};
use crate::error::CoordError;

/// `kDataServiceVersion` of TensorFlow 2.21: clients refuse a dispatcher of another version.
pub const DATA_SERVICE_VERSION: i64 = 9;
/// The largest dataset definition accepted: it travels in the Raft log and in every TaskDef.
pub const MAX_DATASET_BYTES: usize = 16 << 20;

fn status(code: Code, message: String) -> CoordError {
    CoordError::status(code, message)
}

impl DispatcherCore {
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
        let op = DispatcherOp::RegisterDataset {
            requested_id: req
                .optional_dataset_id
                .map(|pb::get_or_register_dataset_request::OptionalDatasetId::DatasetId(d)| d),
            def: def.into(),
            compression: metadata.compression,
            metadata: metadata.encode_to_vec().into(),
        };
        match self.commit(id, op).await? {
            DispatcherOutput::Dataset(dataset_id) => {
                Ok(pb::GetOrRegisterDatasetResponse { dataset_id })
            }
            other => Err(unexpected("register_dataset", &Output::Dispatcher(other))),
        }
    }

    /// The bytes stored for a dataset: its definition or its metadata.
    async fn dataset_bytes(
        &self,
        dataset: &str,
        field: fn(&coord_raft_store::dispatcher::Dataset) -> &Bytes,
    ) -> Result<Bytes, CoordError> {
        self.read(|s| s.datasets.get(dataset).map(|d| field(d).clone()))
            .await?
            .ok_or_else(|| status(Code::NotFound, format!("Dataset id {dataset} not found")))
    }

    /// A dataset's graph; a coord definition has none for TensorFlow.
    pub(super) async fn graph(&self, dataset: &str) -> Result<Bytes, CoordError> {
        static NONE: Bytes = Bytes::new();
        self.dataset_bytes(dataset, |d| match &d.source {
            DatasetSource::Graph(def) => def,
            DatasetSource::Definition { .. } => &NONE,
        })
        .await
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
        let bytes = self.graph(dataset).await?;
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
        let op = DispatcherOp::GetOrCreateJob {
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
            DispatcherOutput::Job(job_id) => Ok(pb::GetOrCreateJobResponse { job_id }),
            other => Err(unexpected("get_or_create_job", &Output::Dispatcher(other))),
        }
    }

    pub async fn workers(&self) -> Result<pb::GetWorkersResponse, CoordError> {
        self.read(|s| pb::GetWorkersResponse {
            workers: s
                .workers
                .iter()
                .filter(|(_, w)| !w.reports_delivery)
                .map(|(address, _)| pb::WorkerInfo {
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
                    if d.compression != coord_raft_store::dispatcher::COMPRESSION_SNAPPY {
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
        let op = DispatcherOp::DisableCompression {
            dataset: req.dataset_id,
            disable: req.disable_compression_at_runtime,
        };
        match self.commit(id, op).await? {
            DispatcherOutput::Compression(decided) => Ok(answer(decided)),
            other => Err(unexpected(
                "disable_compression",
                &Output::Dispatcher(other),
            )),
        }
    }
}

//! `tensorflow.data.DispatcherService`, as TensorFlow 2.21's tf.data workers and `distribute()`
//! clients speak it. Every call runs on the leader (a follower forwards it) and is held through
//! elections, since TF's clients are not written for a dispatcher that answers UNAVAILABLE;
//! changes carry a request id (the client's, coord-proxy's, or one this replica assigns), so a
//! GetSplit driven again after a leader change gets the split it was first given.
//!
//! GetVersion and GetDataServiceConfig are constants of this build, answered by any replica.
//! Distributed snapshots (`Snapshot`, `GetSnapshotSplit`, `GetSnapshotStreams`, behind
//! `tf.data.experimental.distributed_save`) are not served: UNIMPLEMENTED.

use std::sync::Arc;

use coord_proto::tensorflow::data as pb;
use coord_proto::tensorflow::data::dispatcher_service_client::DispatcherServiceClient;
use coord_proto::tensorflow::data::dispatcher_service_server::DispatcherService;
use tonic::{Request, Response, Status};

use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::dispatcher::tf::DATA_SERVICE_VERSION;
use crate::serve::dispatcher::DispatcherCore;
use crate::serve::route::{Kind, Router};

pub struct TfDataService {
    router: Arc<Router>,
    core: Arc<DispatcherCore>,
}

impl TfDataService {
    pub fn new(router: Arc<Router>, core: Arc<DispatcherCore>) -> Self {
        Self { router, core }
    }
}

fn client(ch: PeerChannel) -> DispatcherServiceClient<PeerChannel> {
    DispatcherServiceClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

fn no_snapshots(method: &str) -> Status {
    Status::unimplemented(format!(
        "{method}: coord's tf.data dispatcher does not serve distributed snapshots \
         (tf.data.experimental.distributed_save); use TensorFlow's own dispatcher for them"
    ))
}

#[tonic::async_trait]
impl DispatcherService for TfDataService {
    async fn worker_heartbeat(
        &self,
        req: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/WorkerHeartbeat",
            Kind::Write,
            worker_heartbeat,
            |core, m, id| core.worker_heartbeat(id, m).await
        )
    }

    async fn worker_update(
        &self,
        req: Request<pb::WorkerUpdateRequest>,
    ) -> Result<Response<pb::WorkerUpdateResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/WorkerUpdate",
            Kind::Write,
            worker_update,
            |core, m, id| {
                core.worker_update(id, m).await?;
                Ok(pb::WorkerUpdateResponse {})
            }
        )
    }

    async fn get_dataset_def(
        &self,
        req: Request<pb::GetDatasetDefRequest>,
    ) -> Result<Response<pb::GetDatasetDefResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/GetDatasetDef",
            Kind::Read,
            get_dataset_def,
            |core, m, _id| {
                Ok(pb::GetDatasetDefResponse {
                    dataset_def: Some(core.dataset_def(&m.dataset_id).await?),
                })
            }
        )
    }

    async fn get_split(
        &self,
        req: Request<pb::GetSplitRequest>,
    ) -> Result<Response<pb::GetSplitResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/GetSplit",
            Kind::Write,
            get_split,
            |core, m, id| core.get_split(id, m).await
        )
    }

    async fn get_version(
        &self,
        _req: Request<pb::GetVersionRequest>,
    ) -> Result<Response<pb::GetVersionResponse>, Status> {
        Ok(Response::new(pb::GetVersionResponse {
            version: DATA_SERVICE_VERSION,
        }))
    }

    async fn get_or_register_dataset(
        &self,
        req: Request<pb::GetOrRegisterDatasetRequest>,
    ) -> Result<Response<pb::GetOrRegisterDatasetResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/GetOrRegisterDataset",
            Kind::Write,
            get_or_register_dataset,
            |core, m, id| core.register_dataset(id, m).await
        )
    }

    async fn get_or_create_job(
        &self,
        req: Request<pb::GetOrCreateJobRequest>,
    ) -> Result<Response<pb::GetOrCreateJobResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/GetOrCreateJob",
            Kind::Write,
            get_or_create_job,
            |core, m, id| core.get_or_create_job(id, m).await
        )
    }

    async fn get_or_create_iteration(
        &self,
        req: Request<pb::GetOrCreateIterationRequest>,
    ) -> Result<Response<pb::GetOrCreateIterationResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/GetOrCreateIteration",
            Kind::Write,
            get_or_create_iteration,
            |core, m, id| core.get_or_create_iteration(id, m).await
        )
    }

    async fn maybe_remove_task(
        &self,
        req: Request<pb::MaybeRemoveTaskRequest>,
    ) -> Result<Response<pb::MaybeRemoveTaskResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/MaybeRemoveTask",
            Kind::Write,
            maybe_remove_task,
            |core, m, id| core.maybe_remove_task(id, m).await
        )
    }

    async fn release_iteration_client(
        &self,
        req: Request<pb::ReleaseIterationClientRequest>,
    ) -> Result<Response<pb::ReleaseIterationClientResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/ReleaseIterationClient",
            Kind::Write,
            release_iteration_client,
            |core, m, id| {
                core.release_client(id, m.iteration_client_id).await?;
                Ok(pb::ReleaseIterationClientResponse {})
            }
        )
    }

    async fn client_heartbeat(
        &self,
        req: Request<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/ClientHeartbeat",
            Kind::Write,
            client_heartbeat,
            |core, m, id| core.client_heartbeat(id, m).await
        )
    }

    async fn get_workers(
        &self,
        req: Request<pb::GetWorkersRequest>,
    ) -> Result<Response<pb::GetWorkersResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/GetWorkers",
            Kind::Read,
            get_workers,
            |core, _m, _id| core.workers().await
        )
    }

    async fn get_data_service_metadata(
        &self,
        req: Request<pb::GetDataServiceMetadataRequest>,
    ) -> Result<Response<pb::GetDataServiceMetadataResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/GetDataServiceMetadata",
            Kind::Read,
            get_data_service_metadata,
            |core, m, _id| Ok(pb::GetDataServiceMetadataResponse {
                metadata: Some(core.metadata(&m.dataset_id).await?),
            })
        )
    }

    async fn get_data_service_config(
        &self,
        _req: Request<pb::GetDataServiceConfigRequest>,
    ) -> Result<Response<pb::GetDataServiceConfigResponse>, Status> {
        Ok(Response::new(pb::GetDataServiceConfigResponse {
            config: Some(pb::DataServiceConfig {
                deployment_mode: pb::DeploymentMode::Unspecified as i32,
            }),
        }))
    }

    async fn snapshot(
        &self,
        _req: Request<pb::SnapshotRequest>,
    ) -> Result<Response<pb::SnapshotResponse>, Status> {
        Err(no_snapshots("Snapshot"))
    }

    async fn get_snapshot_split(
        &self,
        _req: Request<pb::GetSnapshotSplitRequest>,
    ) -> Result<Response<pb::GetSnapshotSplitResponse>, Status> {
        Err(no_snapshots("GetSnapshotSplit"))
    }

    async fn get_snapshot_streams(
        &self,
        _req: Request<pb::GetSnapshotStreamsRequest>,
    ) -> Result<Response<pb::GetSnapshotStreamsResponse>, Status> {
        Err(no_snapshots("GetSnapshotStreams"))
    }

    async fn disable_compression_at_runtime(
        &self,
        req: Request<pb::DisableCompressionAtRuntimeRequest>,
    ) -> Result<Response<pb::DisableCompressionAtRuntimeResponse>, Status> {
        routed!(
            self,
            req,
            "tfdata/DisableCompressionAtRuntime",
            Kind::Write,
            disable_compression_at_runtime,
            |core, m, id| core.disable_compression(id, m).await
        )
    }
}

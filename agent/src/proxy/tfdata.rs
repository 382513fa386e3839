//! `tensorflow.data.DispatcherService`, as TensorFlow 2.21's tf.data workers and `distribute()`
//! clients speak it (see [the proxy](super)). Give TensorFlow the proxy's address as its
//! dispatcher (`WorkerConfig.dispatcher_address`, `distribute(service="grpc://...")`): a call
//! whose leader died is sent to the next leader with the same request id and answered as it was
//! first; GetSplits are answered from [split leases](super::splits).

use coord_proto::tensorflow::data::dispatcher_service_client::DispatcherServiceClient;

use super::splits::SplitLeases;
use super::{proxy_service, Call, MESSAGE_LIMIT};
use crate::client::Channel;

fn upstream(ch: Channel) -> DispatcherServiceClient<Channel> {
    DispatcherServiceClient::new(ch)
        .max_decoding_message_size(MESSAGE_LIMIT)
        .max_encoding_message_size(MESSAGE_LIMIT)
}

proxy_service! {
    TfDataProxy,
    coord_proto::tensorflow::data,
    coord_proto::tensorflow::data::dispatcher_service_server::DispatcherService,
    upstream,
    worker_heartbeat(WorkerHeartbeatRequest) -> WorkerHeartbeatResponse: Call::Write;
    worker_update(WorkerUpdateRequest) -> WorkerUpdateResponse: Call::Write;
    get_dataset_def(GetDatasetDefRequest) -> GetDatasetDefResponse: Call::Read;
    get_version(GetVersionRequest) -> GetVersionResponse: Call::Read;
    get_or_register_dataset(GetOrRegisterDatasetRequest) -> GetOrRegisterDatasetResponse: Call::Write;
    get_or_create_job(GetOrCreateJobRequest) -> GetOrCreateJobResponse: Call::Write;
    get_or_create_iteration(GetOrCreateIterationRequest) -> GetOrCreateIterationResponse: Call::WaitingWrite;
    maybe_remove_task(MaybeRemoveTaskRequest) -> MaybeRemoveTaskResponse: Call::WaitingWrite;
    release_iteration_client(ReleaseIterationClientRequest) -> ReleaseIterationClientResponse: Call::Write;
    client_heartbeat(ClientHeartbeatRequest) -> ClientHeartbeatResponse: Call::Write;
    get_workers(GetWorkersRequest) -> GetWorkersResponse: Call::Read;
    get_data_service_metadata(GetDataServiceMetadataRequest) -> GetDataServiceMetadataResponse: Call::Read;
    get_data_service_config(GetDataServiceConfigRequest) -> GetDataServiceConfigResponse: Call::Read;
    snapshot(SnapshotRequest) -> SnapshotResponse: Call::Read;
    get_snapshot_split(GetSnapshotSplitRequest) -> GetSnapshotSplitResponse: Call::Read;
    get_snapshot_streams(GetSnapshotStreamsRequest) -> GetSnapshotStreamsResponse: Call::Read;
    disable_compression_at_runtime(DisableCompressionAtRuntimeRequest) -> DisableCompressionAtRuntimeResponse: Call::Write;
    @fields {
        leases: SplitLeases = SplitLeases::new(DEFAULT_SPLIT_LEASE),
    }
    @custom {
        async fn get_split(
            &self,
            req: tonic::Request<pb::GetSplitRequest>,
        ) -> Result<tonic::Response<pb::GetSplitResponse>, tonic::Status> {
            self.leases
                .get_split(&self.client, req.into_inner())
                .await
                .map(tonic::Response::new)
        }
    }
}

/// The most splits a lease takes unless told otherwise (coord-proxy's `--tfdata-split-lease`);
/// leases grow to it only while their host's workers use them up fast (see
/// [`super::splits`]).
pub const DEFAULT_SPLIT_LEASE: u64 = 256;

impl TfDataProxy {
    /// Leases of at most `splits` splits (1: every GetSplit goes to the ensemble).
    pub fn with_split_lease(mut self, splits: u64) -> Self {
        self.leases = SplitLeases::new(splits);
        self
    }
}

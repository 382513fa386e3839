//! `tensorflow.data.DispatcherService`, as TensorFlow 2.21's tf.data workers and `distribute()`
//! clients speak it (see [the proxy](super)). Give TensorFlow the proxy's address as its
//! dispatcher (`WorkerConfig.dispatcher_address`, `distribute(service="grpc://...")`): a GetSplit
//! whose leader died is sent to the next leader with the same request id and answered with the
//! split it was first given.

use coord_proto::tensorflow::data::dispatcher_service_client::DispatcherServiceClient;

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
    get_split(GetSplitRequest) -> GetSplitResponse: Call::Write;
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
}

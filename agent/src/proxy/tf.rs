//! `tensorflow.CoordinationService`, as TensorFlow 2.21's agents speak it (see [the proxy](super)).
//! Point a job's `TF_CONFIG` at the proxy as `ps:0` (see the README).

use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;

use super::barriers::{BarrierBatches, WaitBatches};
use super::beats::{HeartbeatBatches, DEFAULT_WINDOW};
use super::{proxy_service, Call, MESSAGE_LIMIT};
use crate::client::Channel;

fn upstream(ch: Channel) -> CoordinationServiceClient<Channel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(MESSAGE_LIMIT)
        .max_encoding_message_size(MESSAGE_LIMIT)
}

proxy_service! {
    TfProxy,
    coord_proto::tensorflow,
    coord_proto::tensorflow::coordination_service_server::CoordinationService,
    upstream,
    register_task(RegisterTaskRequest) -> RegisterTaskResponse: Call::Write;
    shutdown_task(ShutdownTaskRequest) -> ShutdownTaskResponse: Call::WaitingWrite;
    reset_task(ResetTaskRequest) -> ResetTaskResponse: Call::Write;
    report_error_to_task(ReportErrorToTaskRequest) -> ReportErrorToTaskResponse: Call::Read;
    report_error_to_service(ReportErrorToServiceRequest) -> ReportErrorToServiceResponse: Call::Write;
    get_task_state(GetTaskStateRequest) -> GetTaskStateResponse: Call::Read;
    watch_job_state(WatchJobStateRequest) -> WatchJobStateResponse: Call::SharedWaitingRead;
    insert_key_value(InsertKeyValueRequest) -> InsertKeyValueResponse: Call::Write;
    get_key_value(GetKeyValueRequest) -> GetKeyValueResponse: Call::SharedWaitingRead;
    try_get_key_value(TryGetKeyValueRequest) -> TryGetKeyValueResponse: Call::SharedRead;
    increment_key_value(IncrementKeyValueRequest) -> IncrementKeyValueResponse: Call::Write;
    get_key_value_dir(GetKeyValueDirRequest) -> GetKeyValueDirResponse: Call::SharedRead;
    delete_key_value(DeleteKeyValueRequest) -> DeleteKeyValueResponse: Call::Write;
    cancel_barrier(CancelBarrierRequest) -> CancelBarrierResponse: Call::Write;
    get_alive_tasks(GetAliveTasksRequest) -> GetAliveTasksResponse: Call::WaitingWrite;
    poll_for_error(PollForErrorRequest) -> PollForErrorResponse: Call::WaitingRead;
    @fields {
        beats: HeartbeatBatches = HeartbeatBatches::new(DEFAULT_WINDOW),
        barriers: BarrierBatches = BarrierBatches::new(true),
        waits: WaitBatches = WaitBatches::new(true),
    }
    @custom {
        /// Held a moment and sent with the other tasks' heartbeats (see [`super::beats`]).
        async fn heartbeat(
            &self,
            req: tonic::Request<pb::HeartbeatRequest>,
        ) -> Result<tonic::Response<pb::HeartbeatResponse>, tonic::Status> {
            self.beats
                .heartbeat(&self.client, req.into_inner())
                .await
                .map(tonic::Response::new)
        }

        /// Recorded with the other tasks' arrivals, and answered with them from one wait on the
        /// instance (see [`super::barriers`]).
        async fn barrier(
            &self,
            req: tonic::Request<pb::BarrierRequest>,
        ) -> Result<tonic::Response<pb::BarrierResponse>, tonic::Status> {
            self.barriers
                .send(&self.client, req.into_inner())
                .await
                .map(tonic::Response::new)
        }

        /// Recorded with the other tasks' arrivals; the job's devices fetched once for all of
        /// them (see [`super::barriers`]).
        async fn wait_for_all_tasks(
            &self,
            req: tonic::Request<pb::WaitForAllTasksRequest>,
        ) -> Result<tonic::Response<pb::WaitForAllTasksResponse>, tonic::Status> {
            self.waits
                .send(&self.client, req.into_inner())
                .await
                .map(tonic::Response::new)
        }
    }
}

impl TfProxy {
    /// Heartbeats held up to `window` and sent together (zero: each on its own, at once).
    pub fn with_heartbeat_window(mut self, window: std::time::Duration) -> Self {
        self.beats = HeartbeatBatches::new(window);
        self
    }

    /// Each task's Barrier and WaitForAllTasks call sent on its own (false), or arrivals
    /// recorded together (true, the default).
    pub fn with_barriers_together(mut self, together: bool) -> Self {
        self.barriers = BarrierBatches::new(together);
        self.waits = WaitBatches::new(together);
        self
    }
}

//! `xla.coordination.CoordinationService`, as jaxlib 0.10+ speaks it (see [the proxy](super)).

use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient;

use super::alive::XlaAliveBatches;
use super::barriers::XlaBarrierBatches;
use super::{proxy_service, Call, MESSAGE_LIMIT};
use crate::client::Channel;

fn upstream(ch: Channel) -> CoordinationServiceClient<Channel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(MESSAGE_LIMIT)
        .max_encoding_message_size(MESSAGE_LIMIT)
}

proxy_service! {
    XlaProxy,
    coord_proto::xla::coordination,
    coord_proto::xla::coordination::coordination_service_server::CoordinationService,
    upstream,
    register_task(RegisterTaskRequest) -> RegisterTaskResponse: Call::WaitingWrite;
    heartbeat(HeartbeatRequest) -> HeartbeatResponse: Call::Read;
    shutdown_task(ShutdownTaskRequest) -> ShutdownTaskResponse: Call::WaitingWrite;
    insert_key_value(InsertKeyValueRequest) -> InsertKeyValueResponse: Call::Write;
    get_key_value(GetKeyValueRequest) -> GetKeyValueResponse: Call::SharedWaitingRead;
    try_get_key_value(TryGetKeyValueRequest) -> TryGetKeyValueResponse: Call::SharedRead;
    increment_key_value(IncrementKeyValueRequest) -> IncrementKeyValueResponse: Call::Write;
    get_key_value_dir(GetKeyValueDirRequest) -> GetKeyValueDirResponse: Call::SharedRead;
    delete_key_value(DeleteKeyValueRequest) -> DeleteKeyValueResponse: Call::Write;
    cancel_barrier(CancelBarrierRequest) -> CancelBarrierResponse: Call::Write;
    poll_for_error(PollForErrorRequest) -> PollForErrorResponse: Call::WaitingRead;
    report_error_to_service(ReportErrorToServiceRequest) -> ReportErrorToServiceResponse: Call::Write;
    @fields {
        barriers: XlaBarrierBatches = XlaBarrierBatches::new(true),
        alive: XlaAliveBatches = XlaAliveBatches::new(true),
    }
    @custom {
        /// Sent once for every task of this sidecar that watches the same version (see
        /// [`super::reads`]). The answer is the job's, the same for every caller: each task's
        /// request is read as the service incarnation and version it names, what the service
        /// checks and answers by, so a host's watching tasks fetch each version from the
        /// ensemble once.
        async fn watch_tasks(
            &self,
            req: tonic::Request<pb::WatchTasksRequest>,
        ) -> Result<tonic::Response<pb::WatchTasksResponse>, tonic::Status> {
            let (metadata, extensions, m) = req.into_parts();
            let alike = pb::WatchTasksRequest {
                incarnations: m.incarnations.map(|i| pb::Incarnations {
                    service_incarnation: i.service_incarnation,
                    ..Default::default()
                }),
                version_number: m.version_number,
            };
            let req = tonic::Request::from_parts(metadata, extensions, alike);
            super::forward(
                (&self.client, &self.reads),
                "watch_tasks",
                req,
                Call::SharedWaitingRead,
                |ch, r| async move { upstream(ch).watch_tasks(r).await },
            )
            .await
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

        /// Recorded with the other tasks' asks, and answered with them from one wait on the
        /// round (see [`super::alive`]).
        async fn get_alive_tasks(
            &self,
            req: tonic::Request<pb::GetAliveTasksRequest>,
        ) -> Result<tonic::Response<pb::GetAliveTasksResponse>, tonic::Status> {
            self.alive
                .send(&self.client, req.into_inner())
                .await
                .map(tonic::Response::new)
        }
    }
}

impl XlaProxy {
    /// Each task's Barrier and GetAliveTasks call sent on its own (false), or arrivals recorded
    /// together (true, the default).
    pub fn with_barriers_together(mut self, together: bool) -> Self {
        self.barriers = XlaBarrierBatches::new(together);
        self.alive = XlaAliveBatches::new(together);
        self
    }
}

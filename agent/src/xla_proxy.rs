//! coord-proxy's service: `xla.coordination.CoordinationService` on localhost, in front of the
//! whole ensemble.
//!
//! jaxlib's client treats a broken connection as fatal (its PollForError is sent without retries,
//! and a failed poll kills the process), so it must never see a replica go away. It talks to this
//! proxy on its own host; the proxy holds one [`CoordClient`] to every replica and sends each call
//! to the leader. When the leader dies mid-call, the proxy sends the *same* request to the next
//! leader: mutations (registration, key writes, barriers, GetAliveTasks) carry a request id, so the
//! new leader answers with the outcome the log already holds instead of applying them twice; calls
//! that park on the service (blocking get, barrier, GetAliveTasks, WatchTasks, PollForError) are
//! re-parked there. jaxlib sees one slow call, never an error.

use crate::client::Channel;
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient;
use coord_proto::xla::coordination::coordination_service_server::CoordinationService;
use tonic::{Request, Response, Status};

use crate::client::CoordClient;

/// Largest message forwarded either way.
const MESSAGE_LIMIT: usize = 64 << 20;

pub struct XlaProxy {
    client: CoordClient,
}

impl XlaProxy {
    pub fn new(client: CoordClient) -> Self {
        Self { client }
    }
}

fn upstream(ch: Channel) -> CoordinationServiceClient<Channel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(MESSAGE_LIMIT)
        .max_encoding_message_size(MESSAGE_LIMIT)
}

/// How a method is forwarded.
#[derive(Clone, Copy)]
enum Call {
    /// Answers at once, changes nothing: re-sent freely.
    Read,
    /// Parks on the service until something happens; changes nothing.
    WaitingRead,
    /// Changes state and answers at once: sent with a request id.
    Write,
    /// Changes state and parks (registration at its barrier, barriers, GetAliveTasks).
    WaitingWrite,
}

/// The service: every method forwarded as its [`Call`] kind says. (The macro writes the whole
/// impl, so that `async_trait` sees the expanded methods.)
macro_rules! forward {
    ($($method:ident($req:ident) -> $resp:ident: $call:expr;)*) => {
        #[tonic::async_trait]
        impl CoordinationService for XlaProxy {
        $(
            async fn $method(
                &self,
                req: Request<xla::$req>,
            ) -> Result<Response<xla::$resp>, Status> {
                let (mutation, waits) = match $call {
                    Call::Read => (false, false),
                    Call::WaitingRead => (false, true),
                    Call::Write => (true, false),
                    Call::WaitingWrite => (true, true),
                };
                self.client
                    .forward(req.into_inner(), mutation, waits, |ch, r| async move {
                        upstream(ch).$method(r).await
                    })
                    .await
                    .map(Response::new)
            }
        )*
        }
    };
}

forward! {
        register_task(RegisterTaskRequest) -> RegisterTaskResponse: Call::WaitingWrite;
        heartbeat(HeartbeatRequest) -> HeartbeatResponse: Call::Read;
        shutdown_task(ShutdownTaskRequest) -> ShutdownTaskResponse: Call::WaitingWrite;
        watch_tasks(WatchTasksRequest) -> WatchTasksResponse: Call::WaitingRead;
        insert_key_value(InsertKeyValueRequest) -> InsertKeyValueResponse: Call::Write;
        get_key_value(GetKeyValueRequest) -> GetKeyValueResponse: Call::WaitingRead;
        try_get_key_value(TryGetKeyValueRequest) -> TryGetKeyValueResponse: Call::Read;
        increment_key_value(IncrementKeyValueRequest) -> IncrementKeyValueResponse: Call::Write;
        get_key_value_dir(GetKeyValueDirRequest) -> GetKeyValueDirResponse: Call::Read;
        delete_key_value(DeleteKeyValueRequest) -> DeleteKeyValueResponse: Call::Write;
        barrier(BarrierRequest) -> BarrierResponse: Call::WaitingWrite;
        cancel_barrier(CancelBarrierRequest) -> CancelBarrierResponse: Call::Write;
        get_alive_tasks(GetAliveTasksRequest) -> GetAliveTasksResponse: Call::WaitingWrite;
        poll_for_error(PollForErrorRequest) -> PollForErrorResponse: Call::WaitingRead;
        report_error_to_service(ReportErrorToServiceRequest) -> ReportErrorToServiceResponse: Call::Write;
}

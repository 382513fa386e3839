//! coord-proxy's services: the coordination services of unmodified TensorFlow ([`tf`]) and
//! jaxlib ([`xla`]) clients, TensorFlow's tf.data dispatcher ([`tfdata`]) and torch's TCPStore
//! ([`tcpstore`]), on localhost, in front of the whole ensemble.
//!
//! Neither client survives a broken connection or an `UNAVAILABLE`: jaxlib's PollForError is sent
//! without retries and a failed poll kills the process; TensorFlow's agent retries nothing but
//! RegisterTask, and a failed heartbeat or barrier ends the job. So they talk to this proxy on
//! their own host; the proxy holds one [`CoordClient`] to every replica and sends each call to the
//! leader. When the leader dies mid-call, the proxy sends the *same* request to the next leader:
//! mutations carry a request id, so the new leader answers with the outcome the log already holds
//! instead of applying them twice; calls that park on the service (blocking get, barriers,
//! GetAliveTasks, watches, PollForError) are re-parked there. The client sees one slow call, never
//! an error. Answers of the service (its errors included) pass through unchanged.
//!
//! The proxy carries every task of its host, so what they send alike goes to the ensemble once:
//! heartbeats held a moment ([`beats`]), barrier and WaitForAllTasks arrivals ([`arrivals`]), and
//! reads of the same key or directory ([`reads`]).

use std::future::Future;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use self::reads::SharedReads;
use crate::client::{Channel, CoordClient};

pub mod alive;
pub mod arrivals;
pub mod barriers;
pub mod beats;
pub mod push;
pub mod reads;
pub mod splits;
pub mod tcpstore;
pub mod tf;
pub mod tfdata;
pub mod xla;

/// Largest message forwarded either way.
const MESSAGE_LIMIT: usize = 64 << 20;

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
    /// A [`Call::Read`] sent once for every task that sends it alike ([`reads`]).
    SharedRead,
    /// A [`Call::WaitingRead`] sent once for every task that sends it alike ([`reads`]).
    SharedWaitingRead,
}

/// Forwards one call of `method` as `call` says, over `client`'s failover.
async fn forward<Req, Resp, F, Fut>(
    (client, reads): (&CoordClient, &Arc<SharedReads>),
    method: &'static str,
    req: Request<Req>,
    call: Call,
    f: F,
) -> Result<Response<Resp>, Status>
where
    Req: prost::Message + Clone + Send + 'static,
    Resp: Clone + Send + Sync + 'static,
    F: Fn(Channel, Request<Req>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Response<Resp>, Status>> + Send,
{
    let (mutation, waits) = match call {
        Call::Read => (false, false),
        Call::WaitingRead => (false, true),
        Call::Write => (true, false),
        Call::WaitingWrite => (true, true),
        Call::SharedRead | Call::SharedWaitingRead => {
            let waits = matches!(call, Call::SharedWaitingRead);
            let client = client.clone();
            let send = move |req| {
                let (client, f) = (client.clone(), f.clone());
                async move { client.forward(req, false, waits, f).await }
            };
            return reads
                .read(method, req.into_inner(), send)
                .await
                .map(Response::new);
        }
    };
    client
        .forward(req.into_inner(), mutation, waits, f)
        .await
        .map(Response::new)
}

/// A proxy service: every method forwarded as its [`Call`] kind says; a service may add fields
/// (each with its initial value) and methods of its own (`custom`). (The macro writes the whole
/// impl, so that `async_trait` sees the expanded methods.)
macro_rules! proxy_service {
    ($proxy:ident, $pb:path, $service:path, $upstream:ident,
     $($method:ident($req:ident) -> $resp:ident: $call:expr;)*
     $(@fields { $($field:ident: $fty:ty = $init:expr,)* } @custom { $($custom:tt)* })?) => {
        pub struct $proxy {
            client: $crate::client::CoordClient,
            reads: std::sync::Arc<super::reads::SharedReads>,
            $($($field: $fty,)*)?
        }

        impl $proxy {
            pub fn new(client: $crate::client::CoordClient) -> Self {
                Self { client, reads: Default::default(), $($($field: $init,)*)? }
            }
        }

        use $pb as pb;

        #[tonic::async_trait]
        impl $service for $proxy {
        $(
            async fn $method(
                &self,
                req: tonic::Request<pb::$req>,
            ) -> Result<tonic::Response<pb::$resp>, tonic::Status> {
                let method = stringify!($method);
                super::forward((&self.client, &self.reads), method, req, $call, |ch, r| async move {
                    $upstream(ch).$method(r).await
                })
                .await
            }
        )*
        $($($custom)*)?
        }
    };
}
use proxy_service;

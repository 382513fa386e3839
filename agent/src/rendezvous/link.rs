//! The worker link's service: what a worker runs for its peers, on one port.
//!
//! A receiver pulls: `RecvTensor` waits on the producer until the tensor is sent, then sends a
//! header and the bytes. [`LinkService::serve`] answers on one port in two ways: over the
//! [`direct`] link (plain framed TCP), which the receivers' [`Links`](super::links)
//! use first because a small tensor's round trip is several times shorter there, and over gRPC,
//! for peers that do not speak the direct link, and for the peer heartbeats.
//!
//! Over gRPC the bytes stream in [`CHUNK_BYTES`] chunks (slices of the
//! producer's buffer). No message is ever larger than a chunk, so a tensor has no size ceiling
//! (gRPC's is 4 GiB a message, tonic's default 4 MiB); message limits and HTTP/2 windows are set
//! for this traffic rather than left at tonic's defaults (4 MiB messages, 64 KiB windows).
//!
//! Workers find each other in the coordination key-value store: each publishes its link address
//! under `coord/links/<task>` ([`publish`]); [`Links::with_kv`](super::links::Links::with_kv)
//! looks them up.

use std::future::Future;
use std::io;
use std::pin::Pin;

use coord_proto::coord::link::worker_link_server::{WorkerLink, WorkerLinkServer};
use coord_proto::coord::link::{
    PeerHeartbeatRequest, PeerHeartbeatResponse, RecvTensorRequest, TensorChunk,
};
use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::direct;
use super::wire::{
    address_key, header_of, CHUNK_BYTES, CONNECTION_WINDOW, MAX_FRAME, MAX_MESSAGE, STREAM_WINDOW,
};
use super::{ParsedKey, Received, RendezvousMgr};
use crate::client::CoordClient;

/// Publishes this worker's link address (overwriting a previous incarnation's).
pub async fn publish(client: &CoordClient, task: &str, address: &str) -> Result<(), Status> {
    client
        .insert(&address_key(task), address.to_string(), true)
        .await
}

/// The link service of one worker.
#[derive(Clone)]
pub struct LinkService {
    mgr: RendezvousMgr,
    task: String,
    incarnation: u64,
}

impl LinkService {
    /// `task` is this worker's task name; `incarnation` identifies this process (a random number
    /// drawn at start), so that peers notice a restart.
    pub fn new(mgr: RendezvousMgr, task: impl Into<String>, incarnation: u64) -> Self {
        Self {
            mgr,
            task: task.into(),
            incarnation,
        }
    }

    /// The tonic service, with this link's message limits.
    pub fn into_server(self) -> WorkerLinkServer<Self> {
        WorkerLinkServer::new(self)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// A server builder with this link's HTTP/2 settings.
    pub fn server_builder() -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .max_frame_size(Some(MAX_FRAME))
            .tcp_nodelay(true)
    }

    /// Serves this link on `listener` until the gRPC server fails: a connection that begins with
    /// the direct link's preface is served by a task of its own, every other one by gRPC.
    pub async fn serve(self, listener: TcpListener) -> Result<(), tonic::transport::Error> {
        let (grpc_tx, grpc_rx) = mpsc::channel::<io::Result<TcpStream>>(64);
        tokio::spawn(direct::accept(listener, self.clone(), grpc_tx));
        let incoming =
            futures::stream::unfold(
                grpc_rx,
                |mut rx| async move { rx.recv().await.map(|c| (c, rx)) },
            );
        Self::server_builder()
            .add_service(self.into_server())
            .serve_with_incoming(incoming)
            .await
    }

    /// The tensor `request` asks for, once sent (both transports' handler).
    pub(super) async fn take(&self, request: RecvTensorRequest) -> Result<Received, Status> {
        let key = ParsedKey::parse(&request.key).map_err(Status::invalid_argument)?;
        let producer = key.src.task_name();
        if producer != self.task {
            return Err(Status::invalid_argument(format!(
                "key {key} is produced by {producer}, but this link is {}",
                self.task
            )));
        }
        Ok(self.mgr.recv_local(request.step_id, &key).await?)
    }
}

/// The direct link serves a call as gRPC's handler does.
impl direct::Producer for LinkService {
    fn take(
        &self,
        request: RecvTensorRequest,
    ) -> impl Future<Output = Result<Received, Status>> + Send {
        LinkService::take(self, request)
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<TensorChunk, Status>> + Send>>;

/// The chunks of one tensor: the header first (with the first slice of data), then the rest.
fn chunks(received: Received) -> impl Iterator<Item = Result<TensorChunk, Status>> {
    let header = header_of(&received);
    let data = received.tensor.data().clone();
    let n = data.len().div_ceil(CHUNK_BYTES).max(1);
    (0..n).map(move |i| {
        let start = i * CHUNK_BYTES;
        let end = (start + CHUNK_BYTES).min(data.len());
        Ok(TensorChunk {
            header: (i == 0).then(|| header.clone()),
            data: data.slice(start..end),
        })
    })
}

#[tonic::async_trait]
impl WorkerLink for LinkService {
    type RecvTensorStream = ChunkStream;

    async fn recv_tensor(
        &self,
        request: Request<RecvTensorRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let received = self.take(request.into_inner()).await?;
        Ok(Response::new(Box::pin(futures::stream::iter(chunks(
            received,
        )))))
    }

    async fn heartbeat(
        &self,
        _request: Request<PeerHeartbeatRequest>,
    ) -> Result<Response<PeerHeartbeatResponse>, Status> {
        Ok(Response::new(PeerHeartbeatResponse {
            task: self.task.clone(),
            incarnation: self.incarnation,
        }))
    }
}

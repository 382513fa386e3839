//! The worker link: the service a worker runs for its peers, and [`Links`], its client side.
//!
//! A receiver pulls: `RecvTensor` waits on the producer until the tensor is sent, then sends a
//! header and the bytes. [`LinkService::serve`] answers on one port in two ways: over the
//! [`direct`](super::direct) link (plain framed TCP), which [`Links`] use first because a small
//! tensor's round trip is several times shorter there, and over gRPC, for peers that do not speak
//! the direct link, and for the peer heartbeats.
//!
//! Over gRPC the bytes stream in [`CHUNK_BYTES`] chunks (slices of the producer's buffer). No
//! message is ever larger than a chunk, so a tensor has no size ceiling (gRPC's is 4 GiB a
//! message, tonic's default 4 MiB); message limits and HTTP/2 windows are set for this traffic
//! rather than left at tonic's defaults (4 MiB messages, 64 KiB windows).
//!
//! Workers find each other in the coordination key-value store: each publishes its link address
//! under `coord/links/<task>` ([`publish`]); [`Links::with_kv`] looks them up.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use coord_proto::coord::link::worker_link_client::WorkerLinkClient;
use coord_proto::coord::link::worker_link_server::{WorkerLink, WorkerLinkServer};
use coord_proto::coord::link::{
    PeerHeartbeatRequest, PeerHeartbeatResponse, RecvTensorRequest, TensorChunk, TensorHeader,
};
use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::buffers::BufferPool;
use super::direct::{self, CallError};
use super::{DType, ParsedKey, Received, RendezvousError, RendezvousMgr, Tensor};
use crate::client::CoordClient;

/// Bytes of tensor data per streamed message. A tensor up to this size crosses as one message,
/// which tonic decodes into one buffer that becomes the received tensor's bytes (no copy to
/// assemble it); a larger one comes in chunks of this size, assembled at the receiver.
///
/// Small enough that every copy on the way (the producer's encode, tonic's decode buffer, the
/// assembly) works on data still in the CPU cache: measured here with 64 MiB tensors, 256 KiB
/// chunks moved 2.1 GB/s where 4 MiB chunks moved 1.2 (128 KiB: 1.6, 512 KiB: 1.5, one run each).
pub const CHUNK_BYTES: usize = 256 << 10;
/// The largest message either side accepts: a chunk and its framing.
const MAX_MESSAGE: usize = CHUNK_BYTES + (64 << 10);
/// HTTP/2 flow-control windows: large enough that a loopback stream is never window-bound.
const STREAM_WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;
/// The largest HTTP/2 frame either side accepts: a chunk crosses in one frame, not 16 of the
/// default 16 KiB.
const MAX_FRAME: u32 = 1 << 20;
/// How long a lookup waits for a peer to publish its address.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(60);

/// The key under which `task` publishes its link address.
pub fn address_key(task: &str) -> String {
    format!("coord/links/{}", task.trim_start_matches('/'))
}

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

type ChunkStream = Pin<Box<dyn Stream<Item = Result<TensorChunk, Status>> + Send>>;

/// What a tensor answer says of the tensor ahead of its bytes (both transports send it).
pub(super) fn header_of(received: &Received) -> TensorHeader {
    TensorHeader {
        dtype: received.tensor.dtype().name().to_string(),
        shape: received.tensor.shape().to_vec(),
        total_bytes: received.tensor.data().len() as u64,
        is_dead: received.is_dead,
    }
}

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

/// The most a receiver allocates for a tensor before its bytes arrive.
pub(super) const MAX_PREALLOCATED: usize = 1 << 30;

/// The dtype and byte count `header` announces, if they agree with its shape.
pub(super) fn check_header(header: &TensorHeader) -> Result<(DType, u64), Status> {
    let dtype = DType::from_name(&header.dtype)
        .ok_or_else(|| Status::invalid_argument(format!("unknown dtype {:?}", header.dtype)))?;
    let expected =
        super::tensor::byte_len(dtype, &header.shape).map_err(Status::invalid_argument)?;
    if expected != header.total_bytes {
        return Err(Status::data_loss(format!(
            "the header announces {} bytes for shape {:?}, which holds {expected}",
            header.total_bytes, header.shape
        )));
    }
    Ok((dtype, expected))
}

/// Finds a task's link address.
pub type Directory = Arc<
    dyn Fn(String) -> Pin<Box<dyn Future<Output = Result<String, RendezvousError>> + Send>>
        + Send
        + Sync,
>;

/// A worker's connections to its peers, and which of them are known dead.
#[derive(Clone)]
pub struct Links {
    inner: Arc<LinksInner>,
}

struct LinksInner {
    directory: Directory,
    peers: Mutex<HashMap<String, Peer>>,
    /// Received tensors' large buffers, reused.
    buffers: Arc<BufferPool>,
    dead: watch::Sender<HashMap<String, RendezvousError>>,
}

/// At most this many idle direct connections are kept per peer (as many as receives a step
/// usually has outstanding from one peer; more are opened when needed and closed after).
const IDLE_PER_PEER: usize = 8;

/// What a worker knows of one peer's link.
struct Peer {
    address: String,
    grpc: WorkerLinkClient<Channel>,
    /// Direct connections not in use.
    idle: Vec<direct::Conn>,
    /// Cleared when the peer turns out to serve gRPC only: its receives then go over gRPC.
    direct: bool,
}

impl Links {
    pub fn new(directory: Directory) -> Self {
        Self {
            inner: Arc::new(LinksInner {
                directory,
                peers: Mutex::default(),
                buffers: Arc::default(),
                dead: watch::Sender::new(HashMap::new()),
            }),
        }
    }

    /// Links whose addresses come from the coordination key-value store.
    pub fn with_kv(client: CoordClient) -> Self {
        Self::new(Arc::new(move |task: String| {
            let client = client.clone();
            Box::pin(async move {
                let key = address_key(&task);
                let value = tokio::time::timeout(LOOKUP_TIMEOUT, client.get(&key))
                    .await
                    .map_err(|_| {
                        RendezvousError::unavailable(format!(
                            "{task} did not publish its link address ({key}) within {LOOKUP_TIMEOUT:?}"
                        ))
                    })??;
                String::from_utf8(value.to_vec()).map_err(|_| {
                    RendezvousError::invalid(format!("the link address of {task} is not UTF-8"))
                })
            })
        }))
    }

    /// The address of `task`'s link, resolving it on first use (and making its gRPC client).
    async fn address(&self, task: &str) -> Result<String, RendezvousError> {
        if let Some(p) = self.lock_peers().get(task) {
            return Ok(p.address.clone());
        }
        let address = (self.inner.directory)(task.to_string()).await?;
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| {
                RendezvousError::invalid(format!("bad link address {address:?} of {task}: {e}"))
            })?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .initial_stream_window_size(Some(STREAM_WINDOW))
            .initial_connection_window_size(Some(CONNECTION_WINDOW))
            .max_frame_size(Some(MAX_FRAME))
            .connect_lazy();
        let grpc = WorkerLinkClient::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let peer = Peer {
            address: address.clone(),
            grpc,
            idle: Vec::new(),
            direct: true,
        };
        // A concurrent first use may have got there first: keep one entry.
        let mut peers = self.lock_peers();
        Ok(peers
            .entry(task.to_string())
            .or_insert(peer)
            .address
            .clone())
    }

    /// The gRPC client of `task`'s link.
    async fn client(&self, task: &str) -> Result<WorkerLinkClient<Channel>, RendezvousError> {
        loop {
            self.address(task).await?;
            // Forgotten in between (a failed call to it): resolve again.
            if let Some(p) = self.lock_peers().get(task) {
                return Ok(p.grpc.clone());
            }
        }
    }

    fn lock_peers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Peer>> {
        self.inner
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Pulls tensor `key` of `step_id` from its producer `task`: over a direct link, or over gRPC
    /// when `task` does not speak it.
    pub async fn fetch(
        &self,
        task: &str,
        step_id: i64,
        key: &ParsedKey,
        receiver: &str,
    ) -> Result<Received, RendezvousError> {
        let request = RecvTensorRequest {
            step_id,
            key: key.as_str().to_string(),
            receiver: receiver.to_string(),
        };
        let failed = |s: Status| {
            RendezvousError::new(
                s.code(),
                format!("receiving {key} from {task}: {}", s.message()),
            )
        };
        let address = self.address(task).await?;
        if let Some(conn) = self.direct_conn(task, &address).await {
            match self.fetch_direct(task, &address, conn, &request).await {
                Ok(received) => return Ok(received),
                Err(CallError::NotSpoken) => self.grpc_only(task, &address),
                Err(CallError::Status(s) | CallError::Malformed(s)) => return Err(failed(s)),
                Err(CallError::Io(e)) => {
                    // Nobody at the address any more, or a broken connection: as gRPC's
                    // UNAVAILABLE, look the address up again next time.
                    self.forget(task);
                    return Err(failed(Status::unavailable(e.to_string())));
                }
            }
        }
        self.fetch_grpc(task, request).await.map_err(failed)
    }

    /// An idle direct connection to `task`, or a new one; `None` when `task` serves gRPC only.
    async fn direct_conn(&self, task: &str, address: &str) -> Option<io::Result<direct::Conn>> {
        {
            let mut peers = self.lock_peers();
            let peer = peers.get_mut(task).filter(|p| p.address == address)?;
            if !peer.direct {
                return None;
            }
            if let Some(conn) = peer.idle.pop() {
                return Some(Ok(conn));
            }
        }
        Some(direct::Conn::connect(address).await)
    }

    /// One call on `conn`, which goes back to the pool if the call left it usable.
    async fn fetch_direct(
        &self,
        task: &str,
        address: &str,
        conn: io::Result<direct::Conn>,
        request: &RecvTensorRequest,
    ) -> Result<Received, CallError> {
        let mut conn = conn?;
        let received = conn.call(request, &self.inner.buffers).await;
        if received.is_ok() || matches!(received, Err(CallError::Status(_))) {
            let mut peers = self.lock_peers();
            if let Some(p) = peers.get_mut(task).filter(|p| p.address == address) {
                if p.idle.len() < IDLE_PER_PEER {
                    p.idle.push(conn);
                }
            }
        }
        received
    }

    /// Idle direct connections to `task`, or `None` when its receives go over gRPC (for tests).
    #[cfg(test)]
    pub(super) fn idle_direct(&self, task: &str) -> Option<usize> {
        self.lock_peers()
            .get(task)
            .filter(|p| p.direct)
            .map(|p| p.idle.len())
    }

    /// `task`, at `address`, turned out to serve gRPC only.
    fn grpc_only(&self, task: &str, address: &str) {
        if let Some(p) = self
            .lock_peers()
            .get_mut(task)
            .filter(|p| p.address == address)
        {
            tracing::debug!(%task, %address, "the peer serves gRPC only");
            p.direct = false;
            p.idle.clear();
        }
    }

    /// [`Self::fetch`] over gRPC: the header in the first chunk, the data in chunks after it.
    async fn fetch_grpc(&self, task: &str, request: RecvTensorRequest) -> Result<Received, Status> {
        let mut client = self.client(task).await?;
        let mut stream = client
            .recv_tensor(request)
            .await
            .inspect_err(|s| self.forget_if_gone(task, s))?
            .into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::data_loss("the stream ended before the header"))?;
        let header = first
            .header
            .ok_or_else(|| Status::data_loss("the first chunk has no header"))?;
        let (dtype, expected) = check_header(&header)?;
        let too_many = || Status::data_loss("more bytes than the header announced");
        let mut second = match stream.message().await? {
            // One chunk: its buffer is the tensor's.
            None => {
                let tensor =
                    Tensor::new(dtype, header.shape, first.data).map_err(Status::data_loss)?;
                return Ok(Received {
                    tensor,
                    is_dead: header.is_dead,
                });
            }
            Some(next) => Some(next.data),
        };
        // Several chunks, assembled. The buffer is sized by the header only up to a bound (a lying
        // header cannot make this worker allocate gigabytes up front) and grows past it.
        let buffers = &self.inner.buffers;
        let mut data = buffers.take((expected as usize).min(MAX_PREALLOCATED));
        if first.data.len() as u64 > expected {
            return Err(too_many());
        }
        data.extend_from_slice(&first.data);
        while let Some(chunk) = second.take() {
            if (data.len() + chunk.len()) as u64 > expected {
                return Err(too_many());
            }
            data.extend_from_slice(&chunk);
            second = stream.message().await?.map(|c| c.data);
        }
        let data = BufferPool::freeze(buffers, data);
        let tensor = Tensor::new(dtype, header.shape, data).map_err(Status::data_loss)?;
        Ok(Received {
            tensor,
            is_dead: header.is_dead,
        })
    }

    /// Asks `task` whether it is alive: its task name and incarnation.
    pub async fn heartbeat(
        &self,
        task: &str,
        from: &str,
        timeout: Duration,
    ) -> Result<u64, RendezvousError> {
        let mut client = self.client(task).await?;
        let mut request = Request::new(PeerHeartbeatRequest {
            from_task: from.to_string(),
        });
        request.set_timeout(timeout);
        let reply = tokio::time::timeout(timeout, client.heartbeat(request))
            .await
            .map_err(|_| {
                RendezvousError::unavailable(format!("{task} did not answer within {timeout:?}"))
            })?
            .map_err(|s| {
                self.forget_if_gone(task, &s);
                RendezvousError::new(s.code(), format!("{task}: {}", s.message()))
            })?
            .into_inner();
        if reply.task != task {
            // An address now used by someone else: look it up again next time.
            self.forget(task);
            return Err(RendezvousError::invalid(format!(
                "the link published for {task} is {}'s",
                reply.task
            )));
        }
        Ok(reply.incarnation)
    }

    /// Drops the cached link of `task` (its address, its connections): the next call looks its
    /// address up again.
    pub fn forget(&self, task: &str) {
        self.lock_peers().remove(task);
    }

    /// A call that could not reach `task` at all (UNAVAILABLE from the transport: connection
    /// refused or reset) means nothing listens at the cached address any more; a restarted peer
    /// has published a new one. A slow peer (a timeout) keeps its link, so that a lookup in the
    /// key-value store, which needs a coordinator leader, is never in the way of its heartbeats.
    fn forget_if_gone(&self, task: &str, status: &Status) {
        if status.code() == tonic::Code::Unavailable {
            self.forget(task);
        }
    }

    /// Marks `task` dead: every receive waiting on it, now or later, fails with `error`.
    pub fn declare_dead(&self, task: &str, error: RendezvousError) {
        self.inner.dead.send_modify(|d| {
            d.entry(task.to_string()).or_insert(error);
        });
    }

    /// Why `task` was declared dead, if it was.
    pub fn dead(&self, task: &str) -> Option<RendezvousError> {
        self.inner.dead.borrow().get(task).cloned()
    }

    /// Resolves once `task` is declared dead, with the reason.
    pub async fn wait_dead(&self, task: &str) -> RendezvousError {
        let mut rx = self.inner.dead.subscribe();
        let found = rx
            .wait_for(|d| d.contains_key(task))
            .await
            .map(|d| d.get(task).cloned());
        match found {
            Ok(e) => e.unwrap_or_else(|| RendezvousError::unavailable(format!("{task} is dead"))),
            // The sender lives as long as `self`; this branch is never taken while it waits.
            Err(_) => std::future::pending().await,
        }
    }
}

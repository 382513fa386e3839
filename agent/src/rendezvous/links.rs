//! [`Links`]: a worker's client side of its peers' links. It finds a peer's address (in the
//! coordination key-value store, by default), keeps a gRPC client and a few idle direct
//! connections per peer, and pulls a tensor over the direct link first, over gRPC from a peer that
//! does not speak it. It also carries the peer heartbeats' calls, and knows which peers were
//! declared dead, so that receives waiting on one fail instead of hanging.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use coord_proto::coord::link::worker_link_client::WorkerLinkClient;
use coord_proto::coord::link::{PeerHeartbeatRequest, RecvTensorRequest};
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use super::buffers::BufferPool;
use super::direct::{self, CallError};
use super::wire::{
    address_key, check_header, CONNECTION_WINDOW, MAX_FRAME, MAX_MESSAGE, MAX_PREALLOCATED,
    STREAM_WINDOW,
};
use super::{ParsedKey, Received, RendezvousError, Tensor};
use crate::client::CoordClient;

/// How long a lookup waits for a peer to publish its address.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(60);

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

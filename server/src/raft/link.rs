//! AppendEntries over a framed TCP link (TLS in a TLS ensemble, see `link_tls`).
//!
//! Every write's commit waits for one AppendEntries round trip to a follower. Over gRPC that trip
//! crosses HTTP/2 and tonic twice, with a task hand-off on each side; on this project's 2-core
//! machine it took about 190 µs for a handler that runs in 18 µs. A link is a TCP connection,
//! opened with [`RAFT_LINK_PREFACE`], that carries one request and then its answer at a time,
//! each a frame of `u32` length (little-endian) and bincode: a call holds a link of its own, and
//! [`LinkPool`] keeps the idle ones per peer, so nothing needs to be multiplexed.
//!
//! A call whose future is dropped (openraft's own timeout) drops the connection with it, so an
//! answer never arrives for the wrong request. When a link cannot be opened, fails, or had a call
//! dropped (a peer that is slow, paused or cut off), the call goes over gRPC instead, and so do
//! the peer's calls of the next [`RETRY_AFTER`]: a peer that does not answer gets at most one new
//! connection a second, and a peer of an older version, which does not know the preface, is
//! served as before. Votes and snapshots always go over gRPC.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use coord_proto::conn::RAFT_LINK_PREFACE;
use coord_raft_store::codec;
use coord_raft_store::types::{NodeId, TypeConfig};
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::raft::link_tls::{LinkStream, LinkTls};
use crate::raft::peers::PEER_MESSAGE_LIMIT;
use crate::raft::service::RaftService;

/// How long a connection attempt may take, and how long after a failed link calls go over gRPC.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A request's body: sent with the request borrowed, read back owned (bincode encodes both
/// alike).
#[derive(Serialize, Deserialize)]
struct LinkRequest<R = AppendEntriesRequest<TypeConfig>> {
    /// The sender's ensemble; a replica answers nothing from another's.
    cluster_id: u64,
    rpc: R,
}

/// An answer's body.
type LinkReply = Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>;

/// `body` framed: its length, then itself. (Frames are also what `pre_append` sends.)
pub fn frame(body: &[u8]) -> io::Result<Vec<u8>> {
    let len = u32::try_from(body.len())
        .map_err(|_| io::Error::other(format!("a frame of {} bytes", body.len())))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(body);
    Ok(frame)
}

/// Writes `body` as one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, body: &[u8]) -> io::Result<()> {
    w.write_all(&frame(body)?).await
}

/// Reads one frame's body; `Ok(None)` when the peer closed the connection between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > PEER_MESSAGE_LIMIT {
        return Err(io::Error::other(format!(
            "a frame of {len} bytes, over the peer message limit of {PEER_MESSAGE_LIMIT}"
        )));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).await?;
    Ok(Some(body))
}

/// What a replica's links have done, for metrics.
#[derive(Default)]
pub struct LinkStats {
    /// AppendEntries answered over a link.
    pub calls: AtomicU64,
    /// Times a link failed or had a call dropped, and calls to that peer went over gRPC for a
    /// while.
    pub fallbacks: AtomicU64,
}

/// At most this many idle links are kept per peer (a replication stream's, a read-index round's
/// and a spare).
const IDLE_PER_PEER: usize = 4;

/// A replica's links to its peers, shared by all its network clients. openraft makes a new
/// client for every read-index round (`ensure_linearizable`) besides the replication streams'
/// own: the links are pooled per peer so that neither opens a connection per call.
pub struct LinkPool {
    source: Option<IpAddr>,
    cluster_id: u64,
    /// A TLS ensemble's links are TLS too.
    tls: Option<Arc<LinkTls>>,
    stats: Arc<LinkStats>,
    peers: Mutex<HashMap<String, PeerLinks>>,
}

#[derive(Default)]
struct PeerLinks {
    /// Buffered for reading, so that a frame's length and body take one read; writes go
    /// straight through.
    idle: Vec<BufReader<LinkStream>>,
    /// When a link to this peer last failed; calls go over gRPC until [`RETRY_AFTER`] passed.
    failed_at: Option<Instant>,
}

impl LinkPool {
    pub fn new(source: Option<IpAddr>, cluster_id: u64, tls: Option<Arc<LinkTls>>) -> Self {
        Self {
            source,
            cluster_id,
            tls,
            stats: Arc::default(),
            peers: Mutex::default(),
        }
    }

    pub fn stats(&self) -> Arc<LinkStats> {
        self.stats.clone()
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<String, PeerLinks>> {
        self.peers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a call to `addr` should try a link now.
    pub fn usable(&self, addr: &str) -> bool {
        self.peers()
            .get(addr)
            .and_then(|p| p.failed_at)
            .is_none_or(|t| t.elapsed() >= RETRY_AFTER)
    }

    fn fail(&self, addr: &str) {
        let mut peers = self.peers();
        let p = peers.entry(addr.to_string()).or_default();
        p.idle.clear();
        p.failed_at = Some(Instant::now());
        self.stats.fallbacks.fetch_add(1, Relaxed);
    }

    /// Sends `rpc` to `addr` and returns the follower's answer. On an error, or when the call is
    /// dropped before its answer, the connection is closed and the peer's links count as failed;
    /// the caller then goes over gRPC (AppendEntries may be sent twice: a follower answers a
    /// repeated one as it did the first).
    pub async fn append_entries(
        self: &Arc<Self>,
        addr: &str,
        rpc: &AppendEntriesRequest<TypeConfig>,
    ) -> io::Result<LinkReply> {
        let idle = self.peers().get_mut(addr).and_then(|p| p.idle.pop());
        let mut call = Checkout {
            pool: self,
            addr,
            conn: idle,
            done: false,
        };
        let reply = call.round_trip(rpc).await?;
        self.stats.calls.fetch_add(1, Relaxed);
        call.release();
        Ok(reply)
    }
}

/// A link taken out of the pool for one call. Put back only once the answer is read: a call
/// that fails or is dropped (openraft's timeout) drops its connection, so an answer never
/// arrives for the wrong request, and marks the peer failed, so that a peer that does not
/// answer gets at most one new connection per [`RETRY_AFTER`].
struct Checkout<'a> {
    pool: &'a LinkPool,
    addr: &'a str,
    conn: Option<BufReader<LinkStream>>,
    /// The answer was read and the connection put back.
    done: bool,
}

impl Checkout<'_> {
    async fn round_trip(
        &mut self,
        rpc: &AppendEntriesRequest<TypeConfig>,
    ) -> io::Result<LinkReply> {
        let conn = match &mut self.conn {
            Some(c) => c,
            None => {
                let tcp = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    open(self.addr, self.pool.source, RAFT_LINK_PREFACE),
                )
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connecting timed out"))??;
                let stream = match &self.pool.tls {
                    Some(tls) => LinkStream::Tls(Box::new(tls.connect(self.addr, tcp).await?)),
                    None => LinkStream::Plain(tcp),
                };
                self.conn.insert(BufReader::new(stream))
            }
        };
        let body = codec::encode(
            "raft link request",
            &LinkRequest {
                cluster_id: self.pool.cluster_id,
                rpc,
            },
        )
        .map_err(io::Error::other)?;
        write_frame(conn, &body).await?;
        // A TLS stream may hold records back until flushed.
        conn.flush().await?;
        let reply = read_frame(conn)
            .await?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "link closed by peer"))?;
        codec::decode("raft link reply", &reply).map_err(io::Error::other)
    }

    /// The call is complete: its connection goes back to the pool.
    fn release(mut self) {
        self.done = true;
        if let Some(conn) = self.conn.take() {
            let mut peers = self.pool.peers();
            let p = peers.entry(self.addr.to_string()).or_default();
            if p.idle.len() < IDLE_PER_PEER {
                p.idle.push(conn);
            }
        }
    }
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.fail(self.addr);
        }
    }
}

/// A plain connection to `addr`, from `source` if given, that has sent `preface`.
pub async fn open(addr: &str, source: Option<IpAddr>, preface: &[u8]) -> io::Result<TcpStream> {
    let target: SocketAddr = tokio::net::lookup_host(addr)
        .await?
        .next()
        .ok_or_else(|| io::Error::other(format!("{addr} resolves to no address")))?;
    let socket = if target.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(ip) = source {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    let mut tcp = socket.connect(target).await?;
    tcp.set_nodelay(true)?;
    tcp.write_all(preface).await?;
    Ok(tcp)
}

/// Reads the next message of a link and checks that it comes from this ensemble (`cluster_of`
/// says from which it claims to be); `None`, logged, when the link is to be closed: the peer
/// closed it, or sent something undecodable or from another ensemble.
pub async fn next_message<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    peer: SocketAddr,
    what: &'static str,
    cluster_id: u64,
    cluster_of: impl Fn(&T) -> u64,
) -> Option<T> {
    let body = match read_frame(r).await {
        Ok(body) => body?,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "{what} closed");
            return None;
        }
    };
    let msg: T = match codec::decode(what, &body) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "undecodable {what} message; connection closed");
            return None;
        }
    };
    let from = cluster_of(&msg);
    if from != cluster_id {
        tracing::warn!(%peer, "{what} message from ensemble {from:016x}; this replica belongs to ensemble {cluster_id:016x}; connection closed");
        return None;
    }
    Some(msg)
}

/// Serves one peer's link (the preface already read, the TLS handshake done if any) until it
/// closes or sends something that is not a request of this ensemble.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    peer: SocketAddr,
    raft: Arc<RaftService>,
    cluster_id: u64,
) {
    let mut tcp = BufReader::new(stream);
    while let Some(req) =
        next_message::<LinkRequest, _>(&mut tcp, peer, "Raft link", cluster_id, |r| r.cluster_id)
            .await
    {
        let reply: LinkReply = raft.append_entries_rpc(req.rpc).await;
        let body = match codec::encode("raft link reply", &reply) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot encode a Raft link reply; link closed");
                return;
            }
        };
        if write_frame(&mut tcp, &body).await.is_err() || tcp.flush().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::Vote;
    use tokio::net::TcpListener;

    fn heartbeat() -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        }
    }

    #[tokio::test]
    async fn frames_round_trip_and_oversized_ones_are_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").await.expect("write");
        write_frame(&mut buf, b"").await.expect("write");
        let mut r = &buf[..];
        assert_eq!(
            read_frame(&mut r).await.expect("read"),
            Some(b"hello".to_vec())
        );
        assert_eq!(read_frame(&mut r).await.expect("read"), Some(Vec::new()));
        assert_eq!(
            read_frame(&mut r).await.expect("read"),
            None,
            "closed between frames"
        );

        let huge = u32::try_from(PEER_MESSAGE_LIMIT + 1).expect("fits");
        let mut r = &huge.to_le_bytes()[..];
        let err = read_frame(&mut r).await.expect_err("over the limit");
        assert!(err.to_string().contains("peer message limit"), "{err}");
        // A frame cut short is an error, not a clean close.
        let mut r = &[5u8, 0, 0, 0, b'a'][..];
        assert!(read_frame(&mut r).await.is_err());
    }

    /// A message from another ensemble, or one that does not decode, closes the link.
    #[tokio::test]
    async fn only_messages_of_this_ensemble_are_taken() {
        let peer: SocketAddr = "127.0.0.1:9".parse().expect("addr");
        let msg = |cluster_id| {
            codec::encode(
                "req",
                &LinkRequest {
                    cluster_id,
                    rpc: heartbeat(),
                },
            )
            .expect("encode")
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg(7)).await.expect("write");
        write_frame(&mut buf, &msg(8)).await.expect("write");
        let mut r = &buf[..];
        let of = |m: &LinkRequest| m.cluster_id;
        let first = next_message::<LinkRequest, _>(&mut r, peer, "test", 7, of).await;
        assert!(first.is_some(), "this ensemble's");
        let second = next_message::<LinkRequest, _>(&mut r, peer, "test", 7, of).await;
        assert!(second.is_none(), "another ensemble's");
        let mut buf = Vec::new();
        write_frame(&mut buf, b"not bincode of a request")
            .await
            .expect("write");
        let mut r = &buf[..];
        assert!(next_message::<LinkRequest, _>(&mut r, peer, "test", 7, of)
            .await
            .is_none());
    }

    /// A stand-in peer on a loopback port: every connection's preface is read, then the link
    /// is handed to `on_link` in a task of its own. Returns the peer's address.
    async fn peer<F, Fut>(on_link: F) -> String
    where
        F: Fn(BufReader<TcpStream>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let mut tcp = BufReader::new(tcp);
                let mut preface = [0u8; RAFT_LINK_PREFACE.len()];
                if tcp.read_exact(&mut preface).await.is_ok() {
                    tokio::spawn(on_link(tcp));
                }
            }
        });
        addr.to_string()
    }

    /// Answers every request on every link with a heartbeat's success, and counts links.
    async fn answering_peer() -> (String, Arc<AtomicU64>) {
        let accepted = Arc::new(AtomicU64::new(0));
        let count = accepted.clone();
        let addr = peer(move |mut tcp| {
            count.fetch_add(1, Relaxed);
            async move {
                while let Ok(Some(body)) = read_frame(&mut tcp).await {
                    let req: LinkRequest = codec::decode("req", &body).expect("request");
                    assert_eq!(req.cluster_id, 7);
                    let reply: LinkReply = Ok(AppendEntriesResponse::Success);
                    let out = codec::encode("reply", &reply).expect("encode");
                    if write_frame(&mut tcp, &out).await.is_err() {
                        return;
                    }
                }
            }
        })
        .await;
        (addr, accepted)
    }

    /// Calls, one after another or from clients made afresh (as openraft makes one for every
    /// read-index round), share one connection.
    #[tokio::test]
    async fn calls_reuse_the_pooled_link() {
        let (addr, accepted) = answering_peer().await;
        let pool = Arc::new(LinkPool::new(None, 7, None));
        for _ in 0..20 {
            assert!(pool.usable(&addr));
            let reply = pool
                .append_entries(&addr, &heartbeat())
                .await
                .expect("call");
            assert!(matches!(reply, Ok(AppendEntriesResponse::Success)));
        }
        assert_eq!(accepted.load(Relaxed), 1, "one connection for 20 calls");
        // Two at once need two links; both are kept for later.
        let hb = heartbeat();
        let (a, b) = tokio::join!(
            pool.append_entries(&addr, &hb),
            pool.append_entries(&addr, &hb)
        );
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(accepted.load(Relaxed), 2);
        let stats = pool.stats();
        assert_eq!(stats.calls.load(Relaxed), 22);
        assert_eq!(stats.fallbacks.load(Relaxed), 0);
    }

    /// A peer that takes the connection but does not speak the link (an older version) makes
    /// the call fail at once, and the next second's calls go over gRPC.
    #[tokio::test]
    async fn a_peer_without_links_sends_calls_to_grpc() {
        // Closes the link without an answer.
        let addr = peer(|tcp| async move { drop(tcp) }).await;
        let pool = Arc::new(LinkPool::new(None, 7, None));
        assert!(pool.usable(&addr));
        assert!(pool.append_entries(&addr, &heartbeat()).await.is_err());
        assert!(!pool.usable(&addr), "calls go over gRPC for a while");
        assert!(
            pool.usable("127.0.0.1:1"),
            "other peers' links are not affected"
        );
        let stats = pool.stats();
        assert_eq!(stats.fallbacks.load(Relaxed), 1);
        assert_eq!(stats.calls.load(Relaxed), 0);
    }

    /// A call dropped before its answer (openraft's timeout) takes its connection with it, and
    /// the link is not used again at once: a stale answer can never be read as the next one's.
    #[tokio::test]
    async fn a_dropped_call_drops_the_connection_and_the_link_rests() {
        let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
        // Reads the request, never answers, and reports when the caller hangs up.
        let addr = peer(move |mut tcp| {
            let seen_tx = seen_tx.clone();
            async move {
                let _ = read_frame(&mut tcp).await;
                let closed = read_frame(&mut tcp).await;
                let _ = seen_tx.send(matches!(closed, Ok(None)));
            }
        })
        .await;
        let pool = Arc::new(LinkPool::new(None, 7, None));
        assert!(pool.usable(&addr));
        let dropped = tokio::time::timeout(
            Duration::from_millis(100),
            pool.append_entries(&addr, &heartbeat()),
        )
        .await;
        assert!(dropped.is_err(), "the call was cut off by the timeout");
        assert!(!pool.usable(&addr), "a dropped call counts as a failure");
        assert_eq!(pool.stats().fallbacks.load(Relaxed), 1);
        let hung_up = tokio::time::timeout(Duration::from_secs(10), seen_rx.recv())
            .await
            .expect("the peer saw the connection close");
        assert_eq!(hung_up, Some(true));
    }
}

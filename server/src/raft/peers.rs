//! Lazily connected gRPC channels per peer address, shared by every caller.
//!
//! openraft asks for a network client per RPC round (e.g. every read-index heartbeat), so clients
//! must be cheap: they clone a cached [`Channel`], which multiplexes calls over one HTTP/2
//! connection and reconnects by itself after the peer comes back.
//!
//! Raft traffic has one channel per peer. Forwarded calls have [`FORWARD_CONNECTIONS`], taken in
//! turn: a connection carries at most the peer's `--max-concurrent-streams` calls at once, and a
//! follower forwards every call of every client that reached it, parked ones included (a barrier
//! of a 100,000-task job parks that many). Past that, further calls, heartbeats among them, would
//! wait in this replica for a stream to free up.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use coord_proto::conn::EagerEnd;
use coord_proto::tls::ClientTls;
use tonic::transport::Channel;

/// A channel to a peer; a request's end travels with its message (see `coord_proto::conn`).
pub type PeerChannel = EagerEnd<Channel>;

/// Largest message exchanged between replicas (AppendEntries batches, snapshot chunks, forwarded
/// requests with their values).
pub const PEER_MESSAGE_LIMIT: usize = 64 << 20;

/// Connections per peer for forwarded calls: 16 × 16,384 streams hold the default
/// `--max-parked-calls` (250,000). Each connects on first use.
const FORWARD_CONNECTIONS: usize = 16;

pub struct PeerChannels {
    /// The channels to each peer, made with TLS configuration generation `.1` (see
    /// `ClientTls::generation`).
    channels: Mutex<(HashMap<String, Vec<PeerChannel>>, u64)>,
    /// The turn of the next caller (see [`FORWARD_CONNECTIONS`]).
    turn: std::sync::atomic::AtomicUsize,
    /// The local address outgoing connections bind to (`--peer-source-ip`); `None` lets the
    /// system choose.
    source: Option<std::net::IpAddr>,
    /// The replica's TLS client configuration (`--tls-*`); `None` for plain gRPC.
    tls: Option<ClientTls>,
    /// Connections begin with the Raft preface, so that peers serve them on their Raft thread
    /// (see `coord_proto::conn`).
    raft: bool,
}

impl PeerChannels {
    pub fn new(source: Option<std::net::IpAddr>, tls: Option<ClientTls>) -> Self {
        Self {
            channels: Mutex::new((HashMap::new(), 0)),
            turn: std::sync::atomic::AtomicUsize::new(0),
            source,
            tls,
            raft: false,
        }
    }

    /// Channels for Raft traffic only.
    pub fn for_raft(source: Option<std::net::IpAddr>, tls: Option<ClientTls>) -> Self {
        Self {
            raft: true,
            ..Self::new(source, tls)
        }
    }

    /// The first channel to `addr` (`host:port`), for one-off calls (status probes, membership):
    /// they need not open every forwarding connection.
    pub fn get(&self, addr: &str) -> Result<PeerChannel, String> {
        self.nth(addr, 0)
    }

    /// A channel to `addr`, the next in turn: for forwarded calls (see [`FORWARD_CONNECTIONS`]).
    pub fn in_turn(&self, addr: &str) -> Result<PeerChannel, String> {
        self.nth(
            addr,
            self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Channel `turn` (modulo their number) to `addr`, created on first use without connecting.
    fn nth(&self, addr: &str, turn: usize) -> Result<PeerChannel, String> {
        let mut guard = self
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A rotated certificate (see `ops::tls_reload`): new connections present the new one;
        // calls already on the old channels finish there.
        let generation = self.tls.as_ref().map_or(0, ClientTls::generation);
        if guard.1 != generation {
            *guard = (HashMap::new(), generation);
        }
        let channels = &mut guard.0;
        if let Some(c) = channels
            .get(addr)
            .and_then(|all| all.get(turn % all.len().max(1)))
        {
            return Ok(c.clone());
        }
        let count = if self.raft { 1 } else { FORWARD_CONNECTIONS };
        let all = (0..count)
            .map(|_| self.connect_lazy(addr))
            .collect::<Result<Vec<_>, _>>()?;
        let channel = all[turn % count].clone();
        channels.insert(addr.to_string(), all);
        Ok(channel)
    }

    /// A new channel to `addr`, not connected yet.
    fn connect_lazy(&self, addr: &str) -> Result<PeerChannel, String> {
        let channel = coord_proto::tls::endpoint(addr, self.tls.as_ref())
            .map_err(|e| format!("peer {addr}: {e}"))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            // A peer that stops answering (a one-way partition, a frozen process) is noticed
            // within a few seconds, failing the calls in flight on that connection.
            .http2_keep_alive_interval(Duration::from_secs(1))
            .keep_alive_timeout(Duration::from_secs(3))
            .keep_alive_while_idle(true)
            // Room for a snapshot chunk or a batch of large values without stalling on flow
            // control.
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(16 << 20));
        let channel = coord_proto::conn::for_many_calls(channel);
        Ok(EagerEnd(if self.raft {
            coord_proto::conn::connect_raft_lazy(&channel, self.source)
        } else {
            coord_proto::conn::connect_lazy(&channel, self.source)
        }))
    }
}

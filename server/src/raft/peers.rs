//! One lazily connected gRPC channel per peer address, shared by every caller.
//!
//! openraft asks for a network client per RPC round (e.g. every read-index heartbeat), so clients
//! must be cheap: they clone a cached [`Channel`], which multiplexes all calls over one HTTP/2
//! connection and reconnects by itself after the peer comes back.

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

pub struct PeerChannels {
    /// The channels, made with TLS configuration generation `.1` (see `ClientTls::generation`).
    channels: Mutex<(HashMap<String, PeerChannel>, u64)>,
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

    /// The channel to `addr` (`host:port`), created on first use without connecting.
    pub fn get(&self, addr: &str) -> Result<PeerChannel, String> {
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
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
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
        let channel = EagerEnd(if self.raft {
            coord_proto::conn::connect_raft_lazy(&channel, self.source)
        } else {
            coord_proto::conn::connect_lazy(&channel, self.source)
        });
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}

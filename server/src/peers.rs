//! One lazily connected gRPC channel per peer address, shared by every caller.
//!
//! openraft asks for a network client per RPC round (e.g. every read-index heartbeat), so clients
//! must be cheap: they clone a cached [`Channel`], which multiplexes all calls over one HTTP/2
//! connection and reconnects by itself after the peer comes back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// Largest message exchanged between replicas (AppendEntries batches, snapshot chunks, forwarded
/// requests with their values).
pub const PEER_MESSAGE_LIMIT: usize = 64 << 20;

#[derive(Default)]
pub struct PeerChannels {
    channels: Mutex<HashMap<String, Channel>>,
}

impl PeerChannels {
    /// The channel to `addr` (`host:port`), created on first use without connecting.
    pub fn get(&self, addr: &str) -> Result<Channel, String> {
        let mut channels = self
            .channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true)
            // Room for a snapshot chunk or a batch of large values without stalling on flow
            // control.
            .initial_stream_window_size(Some(8 << 20))
            .initial_connection_window_size(Some(16 << 20))
            .connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }
}

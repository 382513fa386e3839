//! torch's `TCPStore`, served by coord-proxy (`--tcpstore-listen`) over the ensemble's raw key
//! space (`coord.kv.RawKeys`), so that unmodified torch processes (`torchrun`'s c10d rendezvous,
//! `init_process_group`) keep their store when any replica dies.
//!
//! torch's client holds one TCP connection per store object and never reconnects, so only a
//! process on its own host can keep that connection open across a leader change: this one. Each
//! accepted connection is one task with a session of request ids of its own (one client of the
//! ensemble per torch connection), so a call re-sent to a new leader applies once, and a parked
//! WAIT or BARRIER is parked again there. torch sees a slow call, never an error.
//!
//! - [`codec`]: the frames, byte for byte, and torch's limits.
//! - [`conn`]: one connection: handshake, requests in turn, WAIT and its cancellation, and what
//!   closes a connection (logged).
//! - [`ops`]: what each request does on the ensemble.
//! - [`reads`]: GETs of many connections sent together.
//! - [`adds`]: ADDs of many connections sent together.
//! - [`waits`]: WAITs of many connections for the same keys, parked as one call.
//! - [`order`]: reply-less writes seen by every connection in the order they arrived.

mod adds;
pub mod codec;
mod conn;
mod ops;
mod order;
mod reads;
mod waits;

/// One torch connection's calls on the ensemble; the fault harness drives it directly (its raw-key
/// clients call exactly what a torch connection through the proxy calls).
pub use ops::Store;

use bytes::Bytes;
use tokio::net::TcpListener;

use crate::client::CoordClient;

/// Accepts torch connections on `listener` for as long as the proxy runs; every key is stored
/// under `prefix` (one store per job on a shared ensemble).
pub async fn serve(listener: TcpListener, client: CoordClient, prefix: Bytes) {
    let order = std::sync::Arc::new(order::WriteOrder::default());
    let stores = ops::Store::new(client, prefix);
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(conn::serve(stream, stores.sibling(), order.clone()));
            }
            Err(e) => {
                // Out of file descriptors, most likely: the connections already open go on.
                eprintln!("coord-proxy: tcpstore: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

//! The gRPC port's accept loop. Each accepted connection is sorted in a task of its own (a slow
//! caller holds up nobody): one that begins with [`RAFT_PREFACE`] is a peer's Raft connection and
//! goes to the server on the Raft thread, every other one to the client server (see
//! `coord_proto::conn` for why). Then comes the upgrade (the TLS handshake, or nothing), and the
//! connection is served with [`Coalesced`] writes. A replica also takes framed TCP links, on the
//! Raft thread too: a leader's pre-appends ([`PRE_APPEND_PREFACE`], see `pre_append`) and
//! replication streams' AppendEntries ([`RAFT_LINK_PREFACE`], see `link`), TLS after the preface
//! in a TLS ensemble ([`serve_links`]).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use coord_proto::conn::{Coalesced, PRE_APPEND_PREFACE, RAFT_LINK_PREFACE, RAFT_PREFACE};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// How long a caller may take to send its first bytes.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);

pub type Connections<IO> = ReceiverStream<io::Result<Coalesced<IO>>>;

/// The connections of one port, sorted.
pub struct Incoming<IO> {
    /// Everything but peers' Raft traffic.
    pub clients: Connections<IO>,
    /// Connections that began with [`RAFT_PREFACE`].
    pub raft: Connections<IO>,
    /// TCP links that began with [`PRE_APPEND_PREFACE`] or [`RAFT_LINK_PREFACE`], on the Raft
    /// runtime, not yet upgraded (see [`serve_links`]).
    pub links: ReceiverStream<(Link, TcpStream, SocketAddr)>,
}

/// What a plain framed link carries.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Link {
    /// A leader's pre-appends (`pre_append`).
    PreAppend,
    /// A replication stream's AppendEntries (`raft_link`).
    Raft,
}

/// What a connection is, by its first bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Client,
    Raft,
    Link(Link),
}

/// Accepts on `listener` until both streams are dropped. `upgrade` turns a TCP connection into
/// what is served (`None`: refused, and already logged by `upgrade`); it bounds its own time.
/// Raft connections are upgraded, and their sockets polled, on `raft_runtime`.
pub fn incoming<IO, U, F>(
    listener: TcpListener,
    upgrade: U,
    raft_runtime: tokio::runtime::Handle,
) -> Incoming<IO>
where
    IO: Send + 'static,
    U: Fn(TcpStream, SocketAddr) -> F + Send + Sync + 'static,
    F: Future<Output = Option<IO>> + Send + 'static,
{
    let (clients_tx, clients_rx) = mpsc::channel(64);
    let (raft_tx, raft_rx) = mpsc::channel(8);
    let (links_tx, links_rx) = mpsc::channel(8);
    let upgrade = Arc::new(upgrade);
    tokio::spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                () = both_closed(&clients_tx, &raft_tx) => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a little, do not spin.
                        tracing::warn!(error = %e, "cannot accept a connection");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let (upgrade, clients_tx, raft_tx, links_tx, raft_runtime) = (
                upgrade.clone(),
                clients_tx.clone(),
                raft_tx.clone(),
                links_tx.clone(),
                raft_runtime.clone(),
            );
            tokio::spawn(async move {
                let mut tcp = tcp;
                let kind = match tokio::time::timeout(FIRST_BYTES_TIMEOUT, sort(&mut tcp)).await {
                    Ok(Ok(kind)) => kind,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "connection closed before its first bytes");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "no bytes within {FIRST_BYTES_TIMEOUT:?}; connection dropped");
                        return;
                    }
                };
                if kind == Kind::Client {
                    if let Some(io) = upgrade(tcp, peer).await {
                        let _ = clients_tx.send(Ok(Coalesced::new(io))).await;
                    }
                    return;
                }
                // A socket is polled by the runtime it was registered with: move it over, so
                // that its readiness wakes the Raft thread itself rather than this one, which
                // would then have to wake the Raft thread.
                let std = match tcp.into_std() {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "cannot hand a Raft connection over");
                        return;
                    }
                };
                raft_runtime.spawn(async move {
                    let tcp = match TcpStream::from_std(std) {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::warn!(%peer, error = %e, "cannot hand a Raft connection over");
                            return;
                        }
                    };
                    if let Kind::Link(link) = kind {
                        let _ = links_tx.send((link, tcp, peer)).await;
                    } else if let Some(io) = upgrade(tcp, peer).await {
                        let _ = raft_tx.send(Ok(Coalesced::new(io))).await;
                    }
                });
            });
        }
    });
    Incoming {
        clients: ReceiverStream::new(clients_rx),
        raft: ReceiverStream::new(raft_rx),
        links: ReceiverStream::new(links_rx),
    }
}

/// Serves the links `incoming` sorted out, each in a task of its own, until the port closes: in a
/// TLS ensemble (`tls`) each after its handshake with a replica of this ensemble.
pub async fn serve_links(
    mut links: ReceiverStream<(Link, TcpStream, SocketAddr)>,
    raft: Arc<crate::raft::service::RaftService>,
    log: coord_raft_store::storage::LogStore,
    cluster_id: u64,
    tls: Option<Arc<crate::raft::link_tls::LinkTls>>,
) {
    use tokio_stream::StreamExt;
    while let Some((link, tcp, peer)) = links.next().await {
        let (raft, log, tls) = (raft.clone(), log.clone(), tls.clone());
        tokio::spawn(async move {
            match (link, tls) {
                (Link::PreAppend, None) => {
                    crate::raft::pre_append::serve(tcp, peer, log, cluster_id).await
                }
                (Link::Raft, None) => crate::raft::link::serve(tcp, peer, raft, cluster_id).await,
                (link, Some(tls)) => {
                    let Some(tls) = tls.accept(tcp, peer).await else {
                        return;
                    };
                    match link {
                        Link::PreAppend => {
                            crate::raft::pre_append::serve(tls, peer, log, cluster_id).await
                        }
                        Link::Raft => crate::raft::link::serve(tls, peer, raft, cluster_id).await,
                    }
                }
            }
        });
    }
}

async fn both_closed<T>(a: &mpsc::Sender<T>, b: &mpsc::Sender<T>) {
    tokio::join!(a.closed(), b.closed());
}

/// What `tcp` is, by its first bytes; a preface is consumed. Every gRPC client speaks first (the
/// HTTP/2 preface or a TLS hello), and their first bytes differ from the prefaces' first, so a
/// client's connection is told apart at its first byte and left untouched.
async fn sort(tcp: &mut TcpStream) -> io::Result<Kind> {
    const _: () = assert!(RAFT_PREFACE.len() == PRE_APPEND_PREFACE.len());
    const _: () = assert!(RAFT_PREFACE.len() == RAFT_LINK_PREFACE.len());
    let mut head = [0u8; RAFT_PREFACE.len()];
    loop {
        let n = tcp.peek(&mut head).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let kinds = [
            (RAFT_PREFACE, Kind::Raft),
            (PRE_APPEND_PREFACE, Kind::Link(Link::PreAppend)),
            (RAFT_LINK_PREFACE, Kind::Link(Link::Raft)),
        ];
        let Some(&(_, kind)) = kinds.iter().find(|(p, _)| head[..n] == p[..n]) else {
            return Ok(Kind::Client);
        };
        if n == head.len() {
            tcp.read_exact(&mut head).await?;
            return Ok(kind);
        }
        // Part of a preface has arrived (it is sent in one write, so this is rare): peeking
        // again at once would return the same bytes, so wait a little for the rest.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A connection that begins with the preface is sorted to `raft`, without the preface; any
    /// other goes to `clients` with its bytes intact.
    #[tokio::test]
    async fn connections_are_sorted_by_their_first_bytes() {
        use tokio_stream::StreamExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut incoming = incoming(
            listener,
            |tcp, _| async move { Some(tcp) },
            tokio::runtime::Handle::current(),
        );

        let mut peer = TcpStream::connect(addr).await.expect("connect");
        // The preface in two writes, to exercise the partial match.
        peer.write_all(&RAFT_PREFACE[..4]).await.expect("write");
        peer.flush().await.expect("flush");
        tokio::time::sleep(Duration::from_millis(5)).await;
        peer.write_all(&RAFT_PREFACE[4..]).await.expect("write");
        peer.write_all(b"raft bytes").await.expect("write");
        let mut got = incoming
            .raft
            .next()
            .await
            .expect("a raft connection")
            .expect("ok");
        let mut buf = [0u8; 10];
        got.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"raft bytes");

        let mut client = TcpStream::connect(addr).await.expect("connect");
        client
            .write_all(b"PRI * HTTP/2.0\r\n")
            .await
            .expect("write");
        let mut got = incoming
            .clients
            .next()
            .await
            .expect("a client connection")
            .expect("ok");
        let mut buf = [0u8; 16];
        got.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"PRI * HTTP/2.0\r\n");

        let mut link = TcpStream::connect(addr).await.expect("connect");
        link.write_all(RAFT_LINK_PREFACE).await.expect("write");
        link.write_all(b"frames").await.expect("write");
        let (kind, mut got, _) = incoming.links.next().await.expect("a link");
        assert_eq!(kind, Link::Raft);
        let mut buf = [0u8; 6];
        got.read_exact(&mut buf).await.expect("read");
        assert_eq!(&buf, b"frames");
    }
}

//! The leader's pre-appends on the wire (see `coord_raft_store::storage::pre_append`): one
//! one-way TCP connection per follower, opened with [`PRE_APPEND_PREFACE`], that carries frames
//! of `u32` length (little-endian) and the bincode of [`Wire`].
//!
//! The sender writes a frame straight to the socket from the leader's Raft thread, right after
//! the entry is written and before it is synced: no task, no HTTP/2 stream, nothing to wait for.
//! Nothing is answered: a pre-append that is lost, refused or late only means that follower
//! syncs the entry when openraft's AppendEntries brings it, as it would without pre-appends.
//! In a TLS ensemble the connection is TLS, each frame encrypted where it is written (see
//! `link_tls`).

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use coord_proto::conn::PRE_APPEND_PREFACE;
use coord_raft_store::codec;
use coord_raft_store::storage::pre_append::{PreAppend, PreAppendSink};
use coord_raft_store::storage::LogStore;
use coord_raft_store::types::{NodeId, Raft};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::raft::link_tls::{LinkTls, SyncTls};

/// One frame's body.
#[derive(Serialize, Deserialize)]
struct Wire {
    /// The sender's ensemble; a replica takes nothing from another's.
    cluster_id: u64,
    msg: PreAppend,
}

/// How long a connection attempt may take, and how long after a failed one the next is made.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const RETRY_AFTER: Duration = Duration::from_secs(1);

enum Link {
    Connecting,
    /// The socket (non-blocking), and its TLS session in a TLS ensemble.
    Up(std::net::TcpStream, Option<Box<SyncTls>>),
    Failed(Instant),
}

/// Sends a leader's pre-appends to the other voters.
pub struct PreAppender {
    raft: Raft,
    me: NodeId,
    cluster_id: u64,
    source: Option<std::net::IpAddr>,
    tls: Option<Arc<LinkTls>>,
    links: Arc<Mutex<HashMap<String, Link>>>,
}

impl PreAppender {
    pub fn new(
        raft: Raft,
        me: NodeId,
        cluster_id: u64,
        source: Option<std::net::IpAddr>,
        tls: Option<Arc<LinkTls>>,
    ) -> Self {
        Self {
            raft,
            me,
            cluster_id,
            source,
            tls,
            links: Arc::default(),
        }
    }

    /// The other voters' addresses, those furthest replicated first (then in id order), and to
    /// how many of them a pre-append goes: as many as a quorum needs besides the leader (one of
    /// two followers). More would add syncs the commit does not wait for, which, where replicas
    /// share a disk, slow down those it does wait for. A follower that lags (restarting,
    /// paused, cut off) would only pass the entries by, so one that keeps up is tried first.
    fn followers(&self) -> (Vec<String>, usize) {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let voters = membership.voter_ids().count();
        let matched = |id: &NodeId| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(id).copied().flatten())
                .map(|l| l.index)
        };
        let mut others: Vec<NodeId> = membership.voter_ids().filter(|id| *id != self.me).collect();
        others.sort_by_key(|id| (std::cmp::Reverse(matched(id)), *id));
        let addrs = others
            .into_iter()
            .filter_map(|id| membership.get_node(&id).map(|n| n.addr.clone()))
            .collect();
        (addrs, voters / 2)
    }

    fn connect(&self, addr: String) {
        let (links, source, tls) = (self.links.clone(), self.source, self.tls.clone());
        tokio::spawn(async move {
            let opened = open(&addr, source, tls.as_deref());
            let link = match tokio::time::timeout(CONNECT_TIMEOUT, opened).await {
                Ok(Ok((s, tls))) => Link::Up(s, tls),
                Ok(Err(e)) => {
                    tracing::debug!(peer = %addr, error = %e, "no pre-append connection");
                    Link::Failed(Instant::now())
                }
                Err(_) => Link::Failed(Instant::now()),
            };
            links
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(addr, link);
        });
    }
}

/// A connection to `addr` that has sent the preface (and done its TLS handshake, with `tls`),
/// as a non-blocking std socket.
async fn open(
    addr: &str,
    source: Option<std::net::IpAddr>,
    tls: Option<&LinkTls>,
) -> std::io::Result<(std::net::TcpStream, Option<Box<SyncTls>>)> {
    // Non-blocking, as tokio leaves it: a frame that does not fit the socket's buffer at once
    // is not sent (see `send`).
    let tcp = crate::raft::link::open(addr, source, PRE_APPEND_PREFACE).await?;
    match tls {
        Some(tls) => {
            let (tcp, session) = SyncTls::take(tls.connect(addr, tcp).await?)?;
            Ok((tcp, Some(Box::new(session))))
        }
        None => Ok((tcp.into_std()?, None)),
    }
}

/// Writes `frame` to `stream` whole, sealed by `tls` if given; `false` when it could not be:
/// a frame cut short would garble the stream, so the connection must go.
fn write_whole(stream: &mut std::net::TcpStream, tls: Option<&mut SyncTls>, frame: &[u8]) -> bool {
    let bytes = match tls {
        Some(tls) => match tls.seal(frame) {
            Ok(sealed) => sealed,
            Err(_) => return false,
        },
        None => frame,
    };
    matches!(stream.write(bytes), Ok(n) if n == bytes.len())
}

impl PreAppendSink for PreAppender {
    fn send(&self, msg: PreAppend) -> usize {
        let wire = Wire {
            cluster_id: self.cluster_id,
            msg,
        };
        let body = match codec::encode("pre-append", &wire) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode a pre-append");
                return 0;
            }
        };
        let Ok(frame) = crate::raft::link::frame(&body) else {
            return 0;
        };
        let (followers, wanted) = self.followers();
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        let mut sent = 0;
        for addr in followers {
            if sent == wanted {
                break;
            }
            match links.get_mut(&addr) {
                Some(Link::Up(stream, tls)) => {
                    // All or nothing: a frame cut short would garble the stream, so the
                    // connection goes and a new one is made.
                    if write_whole(stream, tls.as_deref_mut(), &frame) {
                        sent += 1;
                    } else {
                        links.remove(&addr);
                    }
                }
                Some(Link::Connecting) => {}
                Some(Link::Failed(at)) if at.elapsed() < RETRY_AFTER => {}
                _ => {
                    links.insert(addr.clone(), Link::Connecting);
                    self.connect(addr);
                }
            }
        }
        sent
    }
}

/// Serves one peer's pre-append connection (the preface already read, the TLS handshake done if
/// any) until it closes or sends something that is not a frame of this ensemble.
pub async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    peer: SocketAddr,
    log: LogStore,
    cluster_id: u64,
) {
    let mut tcp = tokio::io::BufReader::new(stream);
    while let Some(wire) =
        crate::raft::link::next_message::<Wire, _>(&mut tcp, peer, "pre-append", cluster_id, |w| {
            w.cluster_id
        })
        .await
    {
        if let Err(e) = log.pre_append(wire.msg).await {
            tracing::warn!(%peer, error = %e, "pre-append refused; connection closed");
            return;
        }
    }
}

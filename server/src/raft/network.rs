//! The openraft network adapter: openraft's `RaftNetworkFactory`/`RaftNetwork`, implemented here
//! and nowhere else, over the `coord.raft.RaftTransport` gRPC service.
//!
//! Requests and replies are openraft's own types, bincode-encoded. A peer that cannot be reached
//! is reported as `Unreachable`, so openraft backs off instead of hammering it. AppendEntries go
//! over framed links instead (`link`, TLS in a TLS ensemble), and over gRPC only when a link
//! fails. A leader's pre-appends, which openraft knows nothing of, take a path of their own
//! (`pre_append`).

use std::sync::Arc;
use std::time::Duration;

use coord_proto::coord::raft::raft_transport_client::RaftTransportClient;
use coord_proto::coord::raft::RaftRequest;
use coord_raft_store::codec;
use coord_raft_store::types::Raft;
use coord_raft_store::types::{NodeId, TypeConfig};
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::raft::link::{LinkPool, LinkStats};
use crate::raft::link_tls::LinkTls;
use crate::raft::peers::{PeerChannel, PeerChannels, PEER_MESSAGE_LIMIT};

/// Creates per-peer clients for openraft; all of them share the cached channels.
#[derive(Clone)]
pub struct Network {
    cluster_id: u64,
    channels: Arc<PeerChannels>,
    source: Option<std::net::IpAddr>,
    /// AppendEntries go over links (`link`) unless they are turned off.
    links: Option<Arc<LinkPool>>,
    /// A TLS ensemble's links' TLS (`link_tls`).
    link_tls: Option<Arc<LinkTls>>,
}

impl Network {
    pub fn new(
        cluster_id: u64,
        source: Option<std::net::IpAddr>,
        tls: Option<(coord_proto::tls::ClientTls, Arc<LinkTls>)>,
        links: bool,
    ) -> Self {
        let (grpc_tls, link_tls) = tls.unzip();
        Self {
            links: links.then(|| Arc::new(LinkPool::new(source, cluster_id, link_tls.clone()))),
            link_tls,
            cluster_id,
            channels: Arc::new(PeerChannels::for_raft(source, grpc_tls)),
            source,
        }
    }
}

impl Network {
    /// Sends a leader's pre-appends (see `coord_raft_store::storage::pre_append`) to the other
    /// voters of `raft`'s membership.
    pub fn pre_appender(&self, raft: Raft, me: NodeId) -> crate::raft::pre_append::PreAppender {
        crate::raft::pre_append::PreAppender::new(
            raft,
            me,
            self.cluster_id,
            self.source,
            self.link_tls.clone(),
        )
    }

    /// What this replica's AppendEntries links have done (`raft_link`).
    pub fn link_stats(&self) -> Arc<LinkStats> {
        self.links
            .as_ref()
            .map_or_else(Arc::default, |pool| pool.stats())
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let client = self.channels.get(&node.addr).map(|ch| {
            RaftTransportClient::new(ch)
                .max_decoding_message_size(PEER_MESSAGE_LIMIT)
                .max_encoding_message_size(PEER_MESSAGE_LIMIT)
        });
        let link = self
            .links
            .as_ref()
            .map(|pool| (pool.clone(), node.addr.clone()));
        PeerClient {
            target,
            cluster_id: self.cluster_id,
            client,
            link,
        }
    }
}

pub struct PeerClient {
    target: NodeId,
    cluster_id: u64,
    client: Result<RaftTransportClient<PeerChannel>, String>,
    /// The replica's links and this peer's address, when AppendEntries go over links.
    link: Option<(Arc<LinkPool>, String)>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

#[derive(Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl PeerClient {
    async fn call<Req, Resp, E>(&mut self, rpc: Rpc, req: &Req) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                    e.clone(),
                ))))
            }
        };
        let payload = codec::encode("raft request", req)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        // No grpc-timeout: openraft bounds every call itself, and dropping a call resets its
        // stream, which cancels the handler on the peer too. The header would cost an encoding
        // here and a timer there on every message.
        let request = tonic::Request::new(RaftRequest {
            cluster_id: self.cluster_id,
            payload: payload.into(),
        });
        let reply = match rpc {
            Rpc::AppendEntries => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::InstallSnapshot => client.install_snapshot(request).await,
        };
        let reply = reply.map_err(|status| {
            let e = TransportError(format!("{}: {}", status.code(), status.message()));
            if status.code() == tonic::Code::Unavailable {
                RPCError::Unreachable(Unreachable::new(&e))
            } else {
                RPCError::Network(NetworkError::new(&e))
            }
        })?;
        let decoded: Result<Resp, RaftError<NodeId, E>> =
            codec::decode("raft reply", &reply.into_inner().payload)
                .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        decoded.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        if let Some((pool, addr)) = self.link.as_ref().filter(|(p, a)| p.usable(a)) {
            match pool.append_entries(addr, &rpc).await {
                Ok(reply) => {
                    return reply
                        .map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
                }
                Err(e) => tracing::debug!(
                    peer = self.target,
                    error = %e,
                    "Raft link failed; AppendEntries go over gRPC for {:?}",
                    crate::raft::link::RETRY_AFTER
                ),
            }
        }
        self.call(Rpc::AppendEntries, &rpc).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(Rpc::InstallSnapshot, &rpc).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc).await
    }

    /// A dead peer is retried every 200 ms: often enough that a restarted replica catches up at
    /// once, rarely enough to cost nothing.
    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}

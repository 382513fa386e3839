//! [`Observed`]: all the HTTP port sees of a replica, which [`crate::replica`] builds — what it
//! reads, and nothing it could change — and how it asks another replica for its status. Every
//! handler of the port uses it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::StatusRequest;
use coord_raft_store::stats::SyncStats;
use coord_raft_store::storage::StateReader;
use coord_raft_store::types::Raft;

use crate::ops::metrics::Metrics;
use crate::ops::status::ReplicaStatus;
use crate::raft::link::LinkStats;
use crate::raft::peers::PeerChannels;
use crate::serve::apply_hub::ApplyHub;
use crate::serve::proposer::ProposerStats;
use crate::serve::read_index::ReadIndexStats;

/// What the HTTP port reads of a replica.
pub struct Observed {
    pub raft: Raft,
    /// This replica's gRPC address: the status page asks its own port for tasks and barriers,
    /// which routes the question to the leader.
    pub listen: SocketAddr,
    /// How long a leader counts as leader after a quorum last acknowledged it.
    pub lease_ms: u64,
    /// `--ready-max-lag`: how many entries a ready follower may be behind.
    pub ready_max_lag: u64,
    /// Channels to the other replicas, to ask them for their status.
    pub peers: PeerChannels,
    /// Applied state, for the counts in `/metrics`.
    pub reader: StateReader,
    pub rpcs: Arc<Metrics>,
    pub proposer: Arc<ProposerStats>,
    pub read_index: Arc<ReadIndexStats>,
    pub sync: Arc<SyncStats>,
    pub links: Arc<LinkStats>,
    pub hub: Arc<ApplyHub>,
    /// Who leads, as this replica believes (`coord_has_leader`).
    pub leader: crate::raft::leader::LeaderWatch,
    /// The heartbeat checker, for the time this replica was stalled.
    pub heartbeats: Arc<crate::serve::heartbeats::Heartbeats>,
}

impl Observed {
    pub(super) fn status(&self) -> ReplicaStatus {
        ReplicaStatus::of(&self.raft, &self.reader)
    }
}

/// Asks replica `addr` for its status, with a one-second limit; the error says why not.
pub(super) async fn status_of(
    peers: &PeerChannels,
    addr: &str,
) -> Result<coord_proto::coord::admin::StatusReply, String> {
    let channel = peers.get(addr)?;
    let mut req = tonic::Request::new(StatusRequest {});
    req.set_timeout(Duration::from_secs(1));
    tokio::time::timeout(
        Duration::from_secs(1),
        AdminClient::new(channel).status(req),
    )
    .await
    .map_err(|_| format!("{addr} did not answer in time"))?
    .map(tonic::Response::into_inner)
    .map_err(|e| format!("{addr}: {}", e.message()))
}

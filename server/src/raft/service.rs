//! The receiving side of the Raft transport: decodes openraft messages and hands them to the local
//! Raft node. Traffic stamped with another ensemble's cluster id is refused, and so, over TLS, is
//! traffic from any certificate but a replica's of this ensemble.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use coord_proto::coord::raft::raft_transport_server::RaftTransport;
use coord_proto::coord::raft::{RaftReply, RaftRequest};
use coord_raft_store::codec;
use coord_raft_store::types::NodeId;
use coord_raft_store::types::Raft;
use coord_raft_store::TypeConfig;
use openraft::error::RaftError;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::ops::authz::Authz;
use crate::raft::election::LeaderContact;

pub struct RaftService {
    raft: Raft,
    cluster_id: u64,
    /// Every AppendEntries and snapshot chunk is a sign of life from a leader (see `election`).
    contact: Arc<LeaderContact>,
    /// When the last snapshot-transfer progress line was logged.
    snapshot_progress: Mutex<Option<Instant>>,
    /// Over TLS, only replicas of this ensemble may send Raft traffic.
    authz: Authz,
}

/// How long after a snapshot chunk the next one may take before the leader counts as silent
/// (openraft's `install_snapshot_timeout` of this replica's config).
const SNAPSHOT_CHUNK_GRACE: Duration = Duration::from_secs(10);

/// At most one progress line per this interval while a snapshot arrives.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

impl RaftService {
    pub fn new(raft: Raft, cluster_id: u64, contact: Arc<LeaderContact>, authz: Authz) -> Self {
        Self {
            raft,
            cluster_id,
            contact,
            snapshot_progress: Mutex::new(None),
            authz,
        }
    }

    /// Logs a snapshot transfer as it goes: its first chunk, a line a second, its last chunk.
    fn snapshot_progress(&self, rpc: &InstallSnapshotRequest<TypeConfig>) {
        let id = &rpc.meta.snapshot_id;
        let received = rpc.offset + rpc.data.len() as u64;
        let mut last = self
            .snapshot_progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if rpc.offset == 0 {
            tracing::info!(snapshot = %id, last_log = ?rpc.meta.last_log_id, "receiving a snapshot from the leader");
            *last = Some(Instant::now());
        }
        if rpc.done {
            tracing::info!(snapshot = %id, bytes = received, "snapshot received; installing it");
            *last = None;
        } else if last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            tracing::info!(snapshot = %id, received_bytes = received, "receiving a snapshot");
            *last = Some(Instant::now());
        }
    }

    /// Hands an AppendEntries to the Raft node, whichever transport brought it.
    pub async fn append_entries_rpc(
        &self,
        rpc: AppendEntriesRequest<TypeConfig>,
    ) -> Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        self.contact.touch();
        self.raft.append_entries(rpc).await
    }

    fn decode<T: DeserializeOwned>(&self, req: Request<RaftRequest>) -> Result<T, Status> {
        self.authz.replicas_only(&req, "Raft traffic")?;
        let req = req.into_inner();
        if req.cluster_id != self.cluster_id {
            return Err(Status::permission_denied(format!(
                "Raft message from ensemble {:016x}; this replica belongs to ensemble {:016x}",
                req.cluster_id, self.cluster_id
            )));
        }
        codec::decode("raft request", &req.payload)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }
}

fn reply<T: Serialize>(result: &T) -> Result<Response<RaftReply>, Status> {
    let payload =
        codec::encode("raft reply", result).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftReply {
        payload: payload.into(),
    }))
}

#[tonic::async_trait]
impl RaftTransport for RaftService {
    async fn append_entries(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc = self.decode(req)?;
        reply(&self.append_entries_rpc(rpc).await)
    }

    async fn vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let rpc = self.decode(req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = self.decode(req)?;
        // A snapshot chunk is a sign of life too, and the next one may take a while: a transfer
        // longer than the lease must not make the receiver start elections (each of which
        // restarts the transfer, again and again).
        let last = rpc.done;
        self.contact.hold(SNAPSHOT_CHUNK_GRACE);
        self.snapshot_progress(&rpc);
        let result = self.raft.install_snapshot(rpc).await;
        if last || result.is_err() {
            self.contact.release();
        }
        reply(&result)
    }
}

//! The HTTP port: `/livez`, `/readyz`, `/status` (JSON), `/metrics` (Prometheus text, see
//! [`metrics`]) and the status page (see [`page`]).
//!
//! Ready means: a leader is known, this replica is a voting member, and it is caught up. A
//! follower asks the leader how far its replication has got (the leader is the only one that
//! knows), so "caught up" is measured against the leader's log, not guessed locally.
//!
//! The port sees a replica only through [`Observed`], which [`crate::replica`] builds: what it
//! reads, and nothing it could change.

mod metrics;
mod page;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::StatusRequest;
use coord_raft_store::stats::SyncStats;
use coord_raft_store::storage::StateReader;
use coord_raft_store::types::Raft;
use tokio::net::TcpListener;

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
}

impl Observed {
    fn status(&self) -> ReplicaStatus {
        ReplicaStatus::of(&self.raft, &self.reader)
    }
}

pub async fn serve(
    listener: TcpListener,
    observed: Observed,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let app = axum::Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(metrics::render))
        .route("/", get(page::page))
        .route("/api/overview", get(page::overview))
        .with_state(Arc::new(observed));
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::warn!(error = %e, "HTTP server ended with an error");
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

async fn livez(State(s): State<Arc<Observed>>) -> Response {
    match &s.raft.metrics().borrow().running_state {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Raft stopped: {e}\n"),
        )
            .into_response(),
    }
}

async fn status(State(s): State<Arc<Observed>>) -> Json<ReplicaStatus> {
    Json(s.status())
}

async fn readyz(State(s): State<Arc<Observed>>) -> Response {
    match readiness(&s).await {
        Ok(msg) => (StatusCode::OK, format!("{msg}\n")).into_response(),
        Err(msg) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {msg}\n"),
        )
            .into_response(),
    }
}

async fn readiness(s: &Observed) -> Result<String, String> {
    let me = s.status();
    let leader = me.leader_id.ok_or("no leader is known")?;
    if !me.members.iter().any(|m| m.id == me.id && m.voter) {
        return Err(format!("replica {} is not a voting member", me.id));
    }
    if leader == me.id {
        let lease = s.lease_ms;
        return match me.millis_since_quorum_ack {
            Some(ms) if ms <= lease => {
                Ok(format!("ready: replica {} leads term {}", me.id, me.term))
            }
            Some(ms) => Err(format!(
                "leader without a quorum acknowledgement for {ms} ms"
            )),
            None => Err("leader not yet acknowledged by a quorum".into()),
        };
    }
    let addr = me
        .members
        .iter()
        .find(|m| m.id == leader)
        .map(|m| m.addr.clone())
        .ok_or_else(|| format!("leader {leader} is not in the membership"))?;
    let leader_view = status_of(&s.peers, &addr)
        .await
        .map_err(|e| format!("leader {leader} at {e}"))?;
    let matched = leader_view
        .members
        .iter()
        .find(|m| m.id == me.id)
        .and_then(|m| m.matched_index)
        .ok_or_else(|| format!("leader {leader} does not replicate to replica {}", me.id))?;
    let max_lag = s.ready_max_lag;
    let lag = leader_view.last_log_index.saturating_sub(matched);
    let apply_lag = matched.saturating_sub(me.last_applied);
    if lag > max_lag || apply_lag > max_lag {
        return Err(format!(
            "{lag} entries behind leader {leader} and {apply_lag} entries not yet applied (limit {max_lag})"
        ));
    }
    Ok(format!(
        "ready: following leader {leader}, {lag} entries behind"
    ))
}

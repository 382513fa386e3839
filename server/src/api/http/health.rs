//! `/livez`, `/readyz` and `/status`: whether this replica runs, whether it is ready, and its
//! view of the ensemble.
//!
//! Ready means: a leader is known, this replica is a voting member, and it is caught up. A
//! follower asks the leader how far its replication has got (the leader is the only one that
//! knows), so "caught up" is measured against the leader's log, not guessed locally.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::observed::{status_of, Observed};
use crate::ops::status::ReplicaStatus;

pub(super) async fn livez(State(s): State<Arc<Observed>>) -> Response {
    match &s.raft.metrics().borrow().running_state {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Raft stopped: {e}\n"),
        )
            .into_response(),
    }
}

pub(super) async fn status(State(s): State<Arc<Observed>>) -> Json<ReplicaStatus> {
    Json(s.status())
}

pub(super) async fn readyz(State(s): State<Arc<Observed>>) -> Response {
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

//! A replica's view of the ensemble, from openraft's metrics: served as JSON on `/status` and as
//! `coord.admin.Admin/Status` (see [`crate::api::admin`]).

use coord_proto::coord::admin as pb;
use coord_raft_store::storage::StateReader;
use coord_raft_store::types::{NodeId, Raft};
use openraft::ServerState;
use serde::Serialize;

#[derive(Serialize, Debug, Clone)]
pub struct ReplicaStatus {
    pub id: NodeId,
    pub leader_id: Option<NodeId>,
    pub state: String,
    pub term: u64,
    pub last_log_index: u64,
    pub last_applied: u64,
    pub snapshot_index: u64,
    pub purged_index: u64,
    pub members: Vec<MemberStatus>,
    /// Leader only: ms since a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
    /// The memory quota on the replicated state (0: none), as this replica applied it.
    pub quota_bytes: u64,
    /// Bytes of the replicated state counted against the quota.
    pub state_bytes: u64,
    /// A write was refused for the quota and usage has not fallen below 95% of it since.
    pub quota_alarm: bool,
}

#[derive(Serialize, Debug, Clone)]
pub struct MemberStatus {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    /// Leader only: the last index known to be on that member.
    pub matched_index: Option<u64>,
}

pub fn state_name(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "Leader",
        ServerState::Follower => "Follower",
        ServerState::Candidate => "Candidate",
        ServerState::Learner => "Learner",
        ServerState::Shutdown => "Shutdown",
    }
}

impl ReplicaStatus {
    /// This replica's view: Raft's from `raft`, the quota's from its applied state.
    pub fn of(raft: &Raft, reader: &StateReader) -> Self {
        let (quota_bytes, state_bytes, quota_alarm) = reader.read(|a| {
            let s = &a.state;
            (s.quota.bytes, s.usage(), s.quota.alarm)
        });
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| MemberStatus {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
                matched_index: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id))
                    .map(|l| l.map_or(0, |l| l.index)),
            })
            .collect();
        Self {
            id: m.id,
            leader_id: m.current_leader,
            state: state_name(m.state).to_string(),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            members,
            millis_since_quorum_ack: m.millis_since_quorum_ack,
            quota_bytes,
            state_bytes,
            quota_alarm,
        }
    }

    pub fn to_proto(&self) -> pb::StatusReply {
        pb::StatusReply {
            id: self.id,
            leader_id: self.leader_id,
            term: self.term,
            last_log_index: self.last_log_index,
            last_applied: self.last_applied,
            state: self.state.clone(),
            members: self
                .members
                .iter()
                .map(|m| pb::Member {
                    id: m.id,
                    addr: m.addr.clone(),
                    voter: m.voter,
                    matched_index: m.matched_index,
                })
                .collect(),
            millis_since_quorum_ack: self.millis_since_quorum_ack,
            snapshot_index: self.snapshot_index,
            purged_index: self.purged_index,
            quota_bytes: self.quota_bytes,
            state_bytes: self.state_bytes,
            quota_alarm: self.quota_alarm,
        }
    }
}

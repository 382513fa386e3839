//! Membership changes at runtime, on the leader: add a replica (learner first, then voter, through
//! openraft's joint consensus), remove one.
//!
//! A change is refused when the new configuration could not reach a quorum: the leader asks every
//! voter of the new configuration for its status (a short direct call) and requires a majority of
//! them to answer. Removing a healthy replica while another is down, or adding a fourth voter
//! while two of three are down, would leave the ensemble unable to commit; the operator gets
//! FAILED_PRECONDITION naming the replicas that did not answer instead.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::StatusRequest;
use coord_raft_store::state::Code;
use coord_raft_store::types::{Node, NodeId, Raft};
use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;

use crate::error::CoordError;
use crate::raft::peers::PeerChannels;

/// How long a voter may take to answer the reachability probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a new learner may take to catch up before the change is given up.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

pub struct MembershipAdmin {
    raft: Raft,
    me: NodeId,
    channels: PeerChannels,
}

fn refused(message: String) -> CoordError {
    CoordError::status(Code::FailedPrecondition, message)
}

/// openraft's answer to a membership write, as the client should see it.
fn write_error(e: RaftError<NodeId, ClientWriteError<NodeId, Node>>) -> CoordError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => CoordError::NotLeader {
            me: 0,
            leader: f.leader_id.zip(f.leader_node.map(|n| n.addr)),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => refused(format!(
            "the membership change was refused: {e} (retry once the change in progress ends)"
        )),
        RaftError::Fatal(_) => CoordError::LeaderChanged,
    }
}

/// Logs a new learner's progress every second until it has caught up (a long catch-up, or a
/// snapshot being sent, is visible in the leader's log).
async fn report_catch_up(raft: Raft, id: NodeId) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let m = raft.metrics().borrow().clone();
        let last = m.last_log_index.unwrap_or(0);
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).cloned())
            .flatten()
            .map_or(0, |l| l.index);
        tracing::info!(replica = id, matched, of = last, "new replica catching up");
    }
}

impl MembershipAdmin {
    pub fn new(raft: Raft, me: NodeId, channels: PeerChannels) -> Self {
        Self { raft, me, channels }
    }

    /// Current voters and all nodes, from this (leader) replica's view.
    fn membership(&self) -> (BTreeSet<NodeId>, BTreeMap<NodeId, Node>) {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters = membership.voter_ids().collect();
        let nodes = membership.nodes().map(|(id, n)| (*id, n.clone())).collect();
        (voters, nodes)
    }

    fn require_leader(&self) -> Result<(), CoordError> {
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader == Some(self.me) && m.state == openraft::ServerState::Leader {
            Ok(())
        } else {
            Err(CoordError::NotLeader {
                me: self.me,
                leader: None,
            })
        }
    }

    /// Whether the replica at `addr` answers a status call promptly.
    async fn answers(&self, addr: &str) -> bool {
        let Ok(ch) = self.channels.get(addr) else {
            return false;
        };
        let mut client = AdminClient::new(ch);
        let call = client.status(StatusRequest {});
        matches!(tokio::time::timeout(PROBE_TIMEOUT, call).await, Ok(Ok(_)))
    }

    /// Refuses a configuration of `voters` of which no majority answers.
    async fn require_quorum(
        &self,
        voters: &BTreeSet<NodeId>,
        nodes: &BTreeMap<NodeId, Node>,
        what: &str,
    ) -> Result<(), CoordError> {
        let mut silent = Vec::new();
        for id in voters {
            if *id == self.me {
                continue;
            }
            let addr = nodes.get(id).map_or("", |n| n.addr.as_str());
            if !self.answers(addr).await {
                silent.push(format!("{id} ({addr})"));
            }
        }
        let reachable = voters.len() - silent.len();
        let needed = voters.len() / 2 + 1;
        if reachable < needed {
            return Err(refused(format!(
                "{what} would leave voters {voters:?}, of which only {reachable} answer (a quorum needs {needed}); not answering: {}. Bring them back first",
                silent.join(", ")
            )));
        }
        Ok(())
    }

    /// Adds replica `id` at `addr` as a voter: as a learner first, until it has caught up.
    pub async fn add(&self, id: NodeId, addr: String) -> Result<(), CoordError> {
        self.require_leader()?;
        if addr.is_empty() {
            return Err(CoordError::InvalidArgument(format!(
                "replica {id}: the address is empty"
            )));
        }
        let (voters, nodes) = self.membership();
        if let Some(n) = nodes.get(&id) {
            if n.addr != addr {
                return Err(CoordError::status(
                    Code::AlreadyExists,
                    format!(
                        "replica {id} is already a member, at {}; a new replica needs a new id",
                        n.addr
                    ),
                ));
            }
            if voters.contains(&id) {
                // A retry of a change that already happened.
                return Ok(());
            }
        }
        if !self.answers(&addr).await {
            return Err(refused(format!(
                "replica {id} at {addr} does not answer; start it (with --join) before adding it"
            )));
        }
        let mut after = voters.clone();
        after.insert(id);
        let mut all = nodes.clone();
        all.insert(id, Node::new(addr.clone()));
        self.require_quorum(&after, &all, &format!("adding replica {id}"))
            .await?;
        tracing::info!(id, %addr, "adding a replica: catching it up as a learner");
        let progress = tokio::spawn(report_catch_up(self.raft.clone(), id));
        let added = tokio::time::timeout(
            CATCH_UP_TIMEOUT,
            self.raft.add_learner(id, Node::new(addr.clone()), true),
        )
        .await;
        progress.abort();
        match added
        {
            Ok(r) => r.map_err(write_error)?,
            Err(_) => {
                return Err(CoordError::status(Code::DeadlineExceeded,
                    format!("replica {id} at {addr} did not catch up within {CATCH_UP_TIMEOUT:?}; it stays a learner"),
                ))
            }
        };
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(write_error)?;
        tracing::info!(id, %addr, "replica added as a voter");
        Ok(())
    }

    /// Removes replica `id` from the membership.
    pub async fn remove(&self, id: NodeId) -> Result<(), CoordError> {
        self.require_leader()?;
        let (voters, nodes) = self.membership();
        if !nodes.contains_key(&id) {
            return Err(CoordError::status(
                Code::NotFound,
                format!(
                    "replica {id} is not a member (members: {:?})",
                    nodes.keys().collect::<Vec<_>>()
                ),
            ));
        }
        let mut after = voters.clone();
        after.remove(&id);
        if after.is_empty() {
            return Err(refused(format!(
                "replica {id} is the last voter; an ensemble cannot remove its last replica"
            )));
        }
        // (When the leader removes itself, every remaining voter is probed.)
        self.require_quorum(&after, &nodes, &format!("removing replica {id}"))
            .await?;
        tracing::info!(id, "removing a replica");
        let change = if voters.contains(&id) {
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            // A learner (an addition that never finished).
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        self.raft
            .change_membership(change, false)
            .await
            .map_err(write_error)?;
        tracing::info!(id, "replica removed");
        Ok(())
    }
}

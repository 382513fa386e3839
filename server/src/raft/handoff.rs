//! Graceful leader handoff: a leader that is about to stop (SIGTERM, a rolling restart, a node
//! drain) or is asked to (`coordctl member transfer-leader`) hands leadership to a follower first,
//! so that calls stall for a handoff (milliseconds) instead of an election (the leader lease, 300
//! ms by default, plus the time to notice).
//!
//! openraft 0.9 has no leadership transfer. This builds one from what it has:
//!
//! 1. The leader holds new entries back ([`Proposer::hold`]) and waits for those already proposed
//!    to be answered, so its log stops growing.
//! 2. It waits until a voter's log holds every entry (the chosen one, or the first caught up).
//! 3. It asks that voter to campaign (`coord.admin.Admin/Campaign`), which starts an election at
//!    once (`Trigger::elect`).
//! 4. The old leader grants the vote: a voter refuses candidates for the leader lease after it
//!    last heard from its leader, but a leader's own lease clock was last set when it was elected,
//!    and the candidate's log is as long as its own. With its vote and the candidate's, the
//!    candidate has a majority of three; the third voter (still within its lease) is not needed.
//! 5. The old leader, now a follower, answers held writes "leader changed", and routing drives
//!    them again, with their request ids, on the new leader.
//!
//! A leader elected less than a lease ago would refuse the candidate too (its lease clock is
//! recent), so such a leader first waits until a lease has passed since it began to lead. Every
//! step is bounded; a handoff that cannot complete releases the held writes and says why.

use std::time::{Duration, Instant};

use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::CampaignRequest;
use coord_raft_store::types::{NodeId, Raft};
use openraft::ServerState;

use crate::raft::leader::LeaderWatch;
use crate::raft::peers::PeerChannels;
use crate::serve::proposer::Proposer;

/// How long the chosen follower may take to hold every entry.
const CATCH_UP: Duration = Duration::from_secs(2);
/// How long the campaign may take, from the request to another leader known here.
const ELECTED: Duration = Duration::from_secs(3);
/// Waited past a lease since this replica began to lead, for clocks' sake.
const LEASE_MARGIN: Duration = Duration::from_millis(20);
/// How long the follower may take to answer the campaign request.
const CAMPAIGN_CALL: Duration = Duration::from_secs(1);

pub struct Handoff {
    raft: Raft,
    me: NodeId,
    peers: PeerChannels,
    proposer: Proposer,
    leader: LeaderWatch,
    lease: Duration,
}

impl Handoff {
    pub fn new(
        raft: Raft,
        me: NodeId,
        peers: PeerChannels,
        proposer: Proposer,
        leader: LeaderWatch,
        lease: Duration,
    ) -> Self {
        Self {
            raft,
            me,
            peers,
            proposer,
            leader,
            lease,
        }
    }

    /// Whether this replica leads now.
    pub fn leads(&self) -> bool {
        let m = self.raft.metrics().borrow().clone();
        m.state == ServerState::Leader && m.current_leader == Some(self.me)
    }

    /// Hands leadership to voter `to` (or the first caught up); returns the new leader and how
    /// long it took. `Err` says why not; the held writes are released either way.
    pub async fn run(&self, to: Option<NodeId>) -> Result<(NodeId, Duration), String> {
        let started = Instant::now();
        if !self.leads() {
            return Err(format!("replica {} does not lead", self.me));
        }
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let voters: Vec<NodeId> = membership
            .membership()
            .voter_ids()
            .filter(|v| *v != self.me)
            .collect();
        let candidates = match to {
            Some(t) if voters.contains(&t) => vec![t],
            Some(t) => return Err(format!("replica {t} is not a voter of the ensemble")),
            None if voters.is_empty() => return Err("no other voter to hand leadership to".into()),
            None => voters,
        };
        // Within a lease of its election this leader would refuse the candidate (step 4): wait
        // that out first.
        if let Some(since) = self.leader.leading_since() {
            tokio::time::sleep_until(since + self.lease + LEASE_MARGIN).await;
        }
        let _hold = self.proposer.hold(CATCH_UP).await;
        let (target, last) = self.caught_up(&candidates, started).await?;
        let addr = membership
            .membership()
            .get_node(&target)
            .map(|n| n.addr.clone())
            .ok_or_else(|| format!("replica {target} has no address in the membership"))?;
        let channel = self.peers.get(&addr)?;
        let mut req = tonic::Request::new(CampaignRequest {
            leader: self.me,
            leader_last_log_index: last,
        });
        req.set_timeout(CAMPAIGN_CALL);
        AdminClient::new(channel)
            .campaign(req)
            .await
            .map_err(|e| format!("replica {target} did not campaign: {}", e.message()))?;
        let me = self.me;
        let elected = self
            .raft
            .wait(Some(ELECTED))
            .metrics(
                |m| m.current_leader.is_some_and(|l| l != me),
                "another leader",
            )
            .await
            .map_err(|e| format!("no other leader within {ELECTED:?} of the campaign: {e}"))?;
        let leader = elected.current_leader.unwrap_or(target);
        let took = started.elapsed();
        tracing::info!(
            to = leader,
            millis = took.as_millis() as u64,
            "leadership handed over"
        );
        Ok((leader, took))
    }

    /// The first of `candidates` whose log holds every entry of this leader's (whose log no longer
    /// grows), and that last index.
    async fn caught_up(
        &self,
        candidates: &[NodeId],
        started: Instant,
    ) -> Result<(NodeId, u64), String> {
        let mut metrics = self.raft.metrics();
        loop {
            let found = {
                let m = metrics.borrow_and_update();
                if m.current_leader != Some(self.me) {
                    return Err(format!(
                        "replica {} stopped leading during the handoff",
                        self.me
                    ));
                }
                let last = m.last_log_index.unwrap_or(0);
                let matched = |id: &NodeId| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(id))
                        .and_then(|l| l.map(|l| l.index))
                        .unwrap_or(0)
                };
                candidates
                    .iter()
                    .find(|id| matched(id) >= last)
                    .map(|id| (*id, last))
            };
            if let Some(found) = found {
                return Ok(found);
            }
            let left = CATCH_UP.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(format!(
                    "no voter of {candidates:?} caught up with the log within {CATCH_UP:?}"
                ));
            }
            let _ = tokio::time::timeout(left, metrics.changed()).await;
        }
    }
}

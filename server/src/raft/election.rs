//! Faster elections after a leader dies: one nudge, at the moment a vote can first succeed.
//!
//! openraft 0.9 makes a voter refuse votes for `election_timeout_max` after it last heard from its
//! leader (the leader lease). A follower's own election timer fires at a random point in
//! `[min, max)`, i.e. *before* the other followers' leases expire, so the first election after a
//! leader's death is almost always refused, and the candidate waits a whole new random timeout
//! before trying again: failover takes about two election timeouts.
//!
//! This module removes the second wait. A voter that has heard nothing from any leader for the
//! lease plus a margin triggers an election itself, which then succeeds because the other voters'
//! leases have just expired. The margin grows with the voter's rank among the voters (the lowest
//! id goes first), so surviving voters do not split the vote.
//!
//! It is also the only way an election starts: openraft's own election timer is switched off, and
//! before a replica raises its term it asks the other voters whether they would vote for it
//! (Pre-Vote, the Raft thesis §9.6; openraft 0.9 has none). A voter says yes only if it has not
//! heard from a leader for the lease itself and the candidate's log is at least as long as its
//! own. A replica that cannot hear the leader while the others can (a one-way cut) therefore
//! never raises its term, and cannot depose a healthy leader when the cut heals.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::{PreVoteReply, PreVoteRequest};
use coord_raft_store::storage::LogStore;
use coord_raft_store::types::Raft;
use openraft::ServerState;

use crate::raft::peers::PeerChannels;

/// How much later than the lease the first-ranked voter starts an election.
const MARGIN: Duration = Duration::from_millis(10);
/// Extra delay per rank, so that voters do not all start elections at the same instant.
const RANK_STEP: Duration = Duration::from_millis(40);
const CHECK_EVERY: Duration = Duration::from_millis(5);

/// When this replica last received an AppendEntries (entries or heartbeat) from a leader.
pub struct LeaderContact {
    origin: Instant,
    /// Milliseconds since `origin`; 0 = never.
    last_ms: AtomicU64,
    /// A snapshot transfer is under way (see `hold`).
    holding: AtomicBool,
    /// The Raft log, for the last entry a pre-vote compares (set once at start).
    log: std::sync::OnceLock<LogStore>,
}

impl Default for LeaderContact {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
            holding: AtomicBool::new(false),
            log: std::sync::OnceLock::new(),
        }
    }
}

impl LeaderContact {
    /// Gives the contact the log whose last entry pre-votes compare.
    pub fn set_log(&self, log: LogStore) {
        let _ = self.log.set(log);
    }

    /// (term, index) of the last entry in this replica's log.
    fn last_log(&self) -> (u64, u64) {
        self.log
            .get()
            .and_then(LogStore::last_log_id)
            .map_or((0, 0), |l| (l.leader_id.term, l.index))
    }

    pub fn touch(&self) {
        // Never shortens a hold (see `hold`).
        self.last_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    /// Contact now, ending any hold: the snapshot transfer is over.
    pub fn release(&self) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
        self.holding.store(false, Ordering::Relaxed);
    }

    /// Ends a hold that ran out (no chunk for its whole length).
    fn expire_hold(&self) {
        if self.holding.load(Ordering::Relaxed)
            && self.last_ms.load(Ordering::Relaxed) <= self.now_ms()
            && self.holding.swap(false, Ordering::Relaxed)
        {
            tracing::warn!(
                "no snapshot chunk from the leader for the whole hold; elections are back on"
            );
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Counts as contact for `d` from now: a snapshot transfer is under way, and while its chunks
    /// flow the leader sends this replica nothing else (openraft's replication stream to it is
    /// busy with the snapshot), so silence between chunks is not a dead leader.
    ///
    /// openraft 0.9 does not count snapshot chunks as word from the leader either; since its own
    /// election timer is off and elections start only here, the hold keeps this replica from
    /// campaigning (and from granting pre-votes) until [`release`](Self::release) or until the
    /// hold runs out with no further chunk (the leader died mid-transfer).
    pub fn hold(&self, d: Duration) {
        let ms = u64::try_from((self.origin.elapsed() + d).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.last_ms.store(ms, Ordering::Relaxed);
        self.holding.store(true, Ordering::Relaxed);
    }

    /// How long since the last contact, or since this process started if there was none.
    pub fn silence(&self) -> Duration {
        let ms = self.last_ms.load(Ordering::Relaxed);
        self.origin
            .elapsed()
            .saturating_sub(Duration::from_millis(ms))
    }
}

/// Watches for a silent leader and starts an election once its lease has expired everywhere and
/// a majority granted a pre-vote. The only way elections start: openraft's own timer is off.
pub async fn nudge_elections(
    raft: Raft,
    me: u64,
    lease: Duration,
    min_timeout: Duration,
    contact: Arc<LeaderContact>,
    peers: PeerChannels,
) {
    raft.runtime_config().elect(false);
    let mut last_nudge: Option<Instant> = None;
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        contact.expire_hold();
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership().clone();
        // Rank among the voters other than the leader this replica last knew.
        let Some(rank) = membership
            .voter_ids()
            .filter(|id| Some(*id) != m.current_leader)
            .position(|id| id == me)
        else {
            continue;
        };
        if m.state == ServerState::Leader || m.current_leader == Some(me) {
            // Leading is contact: a leader that steps down (a handoff, a higher term) has just
            // heard of a leader, and must not start an election at once against it.
            contact.touch();
            continue;
        }
        let silence = contact.silence();
        let due = lease + MARGIN + RANK_STEP * u32::try_from(rank).unwrap_or(u32::MAX);
        if silence < due || last_nudge.is_some_and(|t| t.elapsed() < min_timeout.max(due)) {
            continue;
        }
        last_nudge = Some(Instant::now());
        let (term, index) = contact.last_log();
        let voters: Vec<(u64, String)> = membership
            .voter_ids()
            .filter(|id| *id != me)
            .filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone())))
            .collect();
        // A majority of all the voters, this one included.
        let all = voters.len() + 1;
        let needed = all / 2 + 1;
        let granted = 1 + pre_votes(&peers, me, term, index, &voters).await;
        if granted < needed {
            tracing::info!(
                silent_ms = u64::try_from(silence.as_millis()).unwrap_or(u64::MAX),
                granted,
                needed,
                "no leader heard from past the lease, but a majority still hears one (or has a longer log): not starting an election"
            );
            continue;
        }
        tracing::info!(
            silent_ms = u64::try_from(silence.as_millis()).unwrap_or(u64::MAX),
            rank,
            granted,
            "no leader heard from past the lease; a majority granted the pre-vote; starting an election"
        );
        if raft.trigger().elect().await.is_err() {
            return;
        }
    }
}

/// How long a voter may take to answer a pre-vote.
const PRE_VOTE_CALL: Duration = Duration::from_millis(200);

/// How many of `voters` grant a pre-vote to `me` with this last log entry.
async fn pre_votes(
    peers: &PeerChannels,
    me: u64,
    term: u64,
    index: u64,
    voters: &[(u64, String)],
) -> usize {
    let asks = voters.iter().map(|(id, addr)| async move {
        let Ok(channel) = peers.get(addr) else {
            return false;
        };
        let mut req = tonic::Request::new(PreVoteRequest {
            candidate: me,
            last_log_term: term,
            last_log_index: index,
        });
        req.set_timeout(PRE_VOTE_CALL);
        match tokio::time::timeout(PRE_VOTE_CALL, AdminClient::new(channel).pre_vote(req)).await {
            Ok(Ok(r)) => {
                let r = r.into_inner();
                if !r.granted {
                    tracing::debug!(voter = id, reason = %r.reason, "pre-vote refused");
                }
                r.granted
            }
            _ => false,
        }
    });
    futures::future::join_all(asks)
        .await
        .into_iter()
        .filter(|g| *g)
        .count()
}

/// A voter's answer to a pre-vote: yes only if it has not heard from a leader for the lease
/// itself, does not lead, and the candidate's last entry is at least as recent as its own.
pub fn answer_pre_vote(
    raft: &Raft,
    contact: &LeaderContact,
    lease: Duration,
    req: &PreVoteRequest,
) -> PreVoteReply {
    let refuse = |reason: String| PreVoteReply {
        granted: false,
        reason,
    };
    let m = raft.metrics().borrow().clone();
    if m.state == ServerState::Leader {
        return refuse(format!("replica {} leads", m.id));
    }
    let silence = contact.silence();
    if silence < lease {
        return refuse(format!(
            "replica {} heard from its leader {} ms ago",
            m.id,
            silence.as_millis()
        ));
    }
    let mine = contact.last_log();
    let theirs = (req.last_log_term, req.last_log_index);
    if theirs < mine {
        return refuse(format!(
            "replica {}'s log ({mine:?}) is ahead of candidate {}'s ({theirs:?})",
            m.id, req.candidate
        ));
    }
    PreVoteReply {
        granted: true,
        reason: String::new(),
    }
}

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
//! id goes first), so surviving voters do not split the vote. The nudge never fires sooner than
//! openraft's own timer could; it only saves the random second wait.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_raft_store::types::Raft;
use openraft::ServerState;

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
    /// A snapshot transfer holds openraft's own election timer off (see `hold`).
    holding: AtomicBool,
}

impl Default for LeaderContact {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
            holding: AtomicBool::new(false),
        }
    }
}

impl LeaderContact {
    pub fn touch(&self) {
        // Never shortens a hold (see `hold`).
        self.last_ms.fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    /// Contact now, ending any hold: the snapshot transfer is over.
    pub fn release(&self, raft: &Raft) {
        self.last_ms.store(self.now_ms(), Ordering::Relaxed);
        if self.holding.swap(false, Ordering::Relaxed) {
            raft.runtime_config().elect(true);
        }
    }

    /// Ends a hold that ran out (no chunk for its whole length).
    fn expire_hold(&self, raft: &Raft) {
        if self.holding.load(Ordering::Relaxed)
            && self.last_ms.load(Ordering::Relaxed) <= self.now_ms()
            && self.holding.swap(false, Ordering::Relaxed)
        {
            tracing::warn!(
                "no snapshot chunk from the leader for the whole hold; elections are back on"
            );
            raft.runtime_config().elect(true);
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
    /// openraft 0.9 does not count snapshot chunks as word from the leader either: its own
    /// election timer would fire during any transfer longer than an election timeout, and the
    /// election restarts the transfer. So the hold also switches openraft's elections off, until
    /// [`release`](Self::release) or until the hold runs out with no further chunk (the leader
    /// died mid-transfer; `nudge_elections` switches them back on).
    pub fn hold(&self, raft: &Raft, d: Duration) {
        let ms = u64::try_from((self.origin.elapsed() + d).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.last_ms.store(ms, Ordering::Relaxed);
        if !self.holding.swap(true, Ordering::Relaxed) {
            raft.runtime_config().elect(false);
        }
    }

    /// How long since the last contact; `None` if there never was one.
    fn silence(&self) -> Option<Duration> {
        match self.last_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(
                self.origin
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms)),
            ),
        }
    }
}

/// Watches for a silent leader and nudges an election once its lease has expired everywhere.
pub async fn nudge_elections(
    raft: Raft,
    me: u64,
    lease: Duration,
    min_timeout: Duration,
    contact: Arc<LeaderContact>,
) {
    let mut last_nudge: Option<Instant> = None;
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        contact.expire_hold(&raft);
        let (state, rank, leader) = {
            let m = raft.metrics().borrow().clone();
            let membership = m.membership_config.membership();
            // Rank among the voters other than the leader this replica last knew.
            let rank = membership
                .voter_ids()
                .filter(|id| Some(*id) != m.current_leader)
                .position(|id| id == me);
            (m.state, rank, m.current_leader)
        };
        let Some(rank) = rank else { continue };
        if state == ServerState::Leader || leader == Some(me) {
            // Leading is contact: a leader that steps down (a handoff, a higher term) has just
            // heard of a leader, and must not start an election at once against it.
            contact.touch();
            continue;
        }
        let Some(silence) = contact.silence() else {
            continue;
        };
        let due = lease + MARGIN + RANK_STEP * u32::try_from(rank).unwrap_or(u32::MAX);
        if silence < due || last_nudge.is_some_and(|t| t.elapsed() < min_timeout.max(due)) {
            continue;
        }
        tracing::info!(
            silent_ms = u64::try_from(silence.as_millis()).unwrap_or(u64::MAX),
            rank,
            "no leader heard from past the lease; starting an election"
        );
        last_nudge = Some(Instant::now());
        if raft.trigger().elect().await.is_err() {
            return;
        }
    }
}

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

use std::sync::atomic::{AtomicU64, Ordering};
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
}

impl Default for LeaderContact {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
}

impl LeaderContact {
    pub fn touch(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.last_ms.store(ms, Ordering::Relaxed);
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

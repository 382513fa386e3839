//! Who leads, as this replica currently believes, derived from openraft's metrics.
//!
//! openraft 0.9 keeps a leader in office after it lost contact with its followers (it only steps
//! down when it hears a higher term). So a replica counts itself leader only while a quorum has
//! acknowledged it within the lease (the longest election timeout): past that, another replica
//! may already lead, and this one serves nothing rather than hang.
//!
//! A leader also counts as leader only once its state machine has caught up with what was
//! committed before its term (see [`ready`]): it answers heartbeats and parked calls from that
//! state, and serves reads from it.
//!
//! openraft publishes metrics on every turn of its event loop. One task ([`LeaderWatch::start`])
//! turns them into a [`Leadership`] value and publishes that only when it changes, so the many
//! requests waiting on leadership (every in-flight call watches for its loss) are woken by real
//! changes only.

use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::types::{NodeId, Raft};
use openraft::{BasicNode, RaftMetrics, ServerState};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::raft::election::LeaderContact;
use crate::tasks::TaskGuard;

/// How often a follower's silence from its leader is looked at, between metrics changes.
const SILENCE_CHECK: Duration = Duration::from_millis(25);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// This replica leads.
    Me,
    /// Another replica leads; requests go to `addr`.
    Other { id: NodeId, addr: String },
    /// No leader is known (an election is running, or this replica is cut off).
    Unknown,
}

impl Leadership {
    pub fn hint(&self) -> Option<(NodeId, String)> {
        match self {
            Leadership::Other { id, addr } => Some((*id, addr.clone())),
            _ => None,
        }
    }
}

#[derive(Clone)]
pub struct LeaderWatch {
    rx: watch::Receiver<Leadership>,
    /// When this replica last began to lead (see [`LeaderWatch::leading_since`]).
    since: std::sync::Arc<std::sync::Mutex<Option<Instant>>>,
}

impl LeaderWatch {
    /// Starts deriving leadership from `raft`'s metrics, in a task on `raft_runtime`: the
    /// metrics change on every turn of the Raft core's loop, and following them from another
    /// thread cost a wake-up of that thread each time (several per write, on every replica).
    pub fn start(
        raft: &Raft,
        me: NodeId,
        lease: Duration,
        floor: StartFloor,
        contact: Arc<LeaderContact>,
        raft_runtime: &tokio::runtime::Handle,
        tasks: &mut TaskGuard,
    ) -> Self {
        let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
        let mut metrics = raft.metrics();
        let (tx, rx) = watch::channel(leadership_of(me, lease_ms, floor, &metrics.borrow()));
        // A follower that has not heard from its leader for the lease no longer counts on it:
        // with Pre-Vote it keeps its term (and openraft its leader) through a one-way cut, and
        // its forwards to that leader may never be answered.
        let heard = move |l: Leadership| match l {
            Leadership::Other { .. } if contact.silence() > lease => Leadership::Unknown,
            l => l,
        };
        let since = std::sync::Arc::new(std::sync::Mutex::new(None));
        let began = since.clone();
        tasks.spawn_on(raft_runtime, "leadership", async move {
            loop {
                tokio::select! {
                    changed = metrics.changed() => if changed.is_err() { break },
                    () = tokio::time::sleep(SILENCE_CHECK) => {}
                }
                let (now, term, applied) = {
                    let m = metrics.borrow_and_update();
                    (
                        heard(leadership_of(me, lease_ms, floor, &m)),
                        m.current_term,
                        m.last_applied,
                    )
                };
                tx.send_if_modified(|l| {
                    let changed = *l != now;
                    if changed && now == Leadership::Me {
                        *began
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) =
                            Some(Instant::now());
                        tracing::info!(
                            term,
                            applied = ?applied,
                            ?floor,
                            "serving as leader"
                        );
                    }
                    *l = now;
                    changed
                });
            }
            // Raft stopped: nobody leads here any more.
            tx.send_replace(Leadership::Unknown);
        });
        Self { rx, since }
    }

    /// When this replica last began to lead, if it leads now.
    pub fn leading_since(&self) -> Option<Instant> {
        if self.current() != Leadership::Me {
            return None;
        }
        *self
            .since
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn current(&self) -> Leadership {
        self.rx.borrow().clone()
    }

    /// Resolves once this replica is no longer (or no longer confirmed as) the leader.
    pub async fn lost(&self) {
        let mut rx = self.rx.clone();
        let _ = rx.wait_for(|l| *l != Leadership::Me).await;
    }

    /// Waits until the leadership differs from `seen`, or until `until`; returns what it is then.
    pub async fn changed_from(&self, seen: &Leadership, until: Instant) -> Leadership {
        let mut rx = self.rx.clone();
        let _ = tokio::time::timeout_at(until, rx.wait_for(|l| l != seen)).await;
        let now = rx.borrow().clone();
        now
    }
}

/// Whether the metrics say this replica leads with a quorum acknowledgement inside the lease.
pub fn leads(me: NodeId, lease_ms: u64, m: &RaftMetrics<NodeId, BasicNode>) -> bool {
    m.current_leader == Some(me)
        && m.state == ServerState::Leader
        && m.millis_since_quorum_ack.is_some_and(|ms| ms <= lease_ms)
}

/// The vote's term and the last durable log index when this process started.
///
/// openraft 0.9 restores a replica that was leader when it stopped as leader of the same term at
/// once, without an election, and then takes the first entry of its term (long committed) as the
/// bar for linearizable reads. But the commit index it restarts with is the one last persisted,
/// which may lag what it had acknowledged before the crash: reads and heartbeat answers from that
/// state would be stale (the crash-consistency loop saw an acknowledged insert missing this way).
/// Everything in its log at startup is its own term's and will commit, so a restored leader
/// serves only once it has applied up to there.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartFloor {
    pub term: u64,
    pub index: u64,
}

/// Whether a leader's state machine is current enough to serve from: it applied an entry of its
/// own term (the blank entry a new leader commits first, so everything committed before its term
/// is applied), and, if it was restored as leader at startup, everything that was in its log.
pub fn ready(floor: StartFloor, m: &RaftMetrics<NodeId, BasicNode>) -> bool {
    let Some(applied) = &m.last_applied else {
        return false;
    };
    applied.leader_id.term == m.current_term
        && (floor.term != m.current_term || applied.index >= floor.index)
}

fn leadership_of(
    me: NodeId,
    lease_ms: u64,
    floor: StartFloor,
    m: &RaftMetrics<NodeId, BasicNode>,
) -> Leadership {
    match m.current_leader {
        Some(_) if leads(me, lease_ms, m) && ready(floor, m) => Leadership::Me,
        Some(id) if id != me => match m.membership_config.membership().get_node(&id) {
            Some(node) => Leadership::Other {
                id,
                addr: node.addr.clone(),
            },
            None => Leadership::Unknown,
        },
        _ => Leadership::Unknown,
    }
}

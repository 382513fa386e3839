//! Who leads, as this replica currently believes, from openraft's metrics.
//!
//! The metrics channel is a `watch`: readers take a short borrow and never hold it across an
//! `.await`.
//!
//! openraft 0.9 keeps a leader in office after it lost contact with its followers (it only steps
//! down when it hears a higher term). So a replica counts itself leader only while a quorum has
//! acknowledged it within the lease (the longest election timeout): past that, another replica
//! may already lead, and this one serves nothing rather than hang.

use std::time::Duration;

use coord_raft_store::types::NodeId;
use openraft::{RaftMetrics, ServerState};
use tokio::sync::watch;
use tokio::time::Instant;

use openraft::BasicNode;

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
    me: NodeId,
    lease_ms: u64,
    rx: watch::Receiver<RaftMetrics<NodeId, BasicNode>>,
}

impl LeaderWatch {
    pub fn new(me: NodeId, lease: Duration, rx: watch::Receiver<RaftMetrics<NodeId, BasicNode>>) -> Self {
        Self {
            me,
            lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
            rx,
        }
    }

    pub fn current(&self) -> Leadership {
        leadership_of(self.me, self.lease_ms, &self.rx.borrow())
    }

    /// Resolves once this replica is no longer (or no longer confirmed as) the leader.
    pub async fn lost(&self) {
        let mut rx = self.rx.clone();
        loop {
            if leadership_of(self.me, self.lease_ms, &rx.borrow_and_update()) != Leadership::Me {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Waits until the leadership differs from `seen`, or until `until`; returns what it is then.
    pub async fn changed_from(&self, seen: &Leadership, until: Instant) -> Leadership {
        let mut rx = self.rx.clone();
        loop {
            let now = leadership_of(self.me, self.lease_ms, &rx.borrow_and_update());
            if &now != seen {
                return now;
            }
            let wait = until.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return now;
            }
            match tokio::time::timeout(wait, rx.changed()).await {
                Ok(Ok(())) => continue,
                // Raft stopped, or the time is up.
                Ok(Err(_)) | Err(_) => return leadership_of(self.me, self.lease_ms, &rx.borrow()),
            }
        }
    }

    /// Waits up to `timeout` for any leader to be known.
    pub async fn known(&self, timeout: Duration) -> Leadership {
        let until = Instant::now() + timeout;
        self.changed_from(&Leadership::Unknown, until).await
    }
}

/// Whether the metrics say this replica leads with a quorum acknowledgement inside the lease.
pub fn leads(me: NodeId, lease_ms: u64, m: &RaftMetrics<NodeId, BasicNode>) -> bool {
    m.current_leader == Some(me)
        && m.state == ServerState::Leader
        && m.millis_since_quorum_ack.is_some_and(|ms| ms <= lease_ms)
}

fn leadership_of(me: NodeId, lease_ms: u64, m: &RaftMetrics<NodeId, BasicNode>) -> Leadership {
    match m.current_leader {
        Some(_) if leads(me, lease_ms, m) => Leadership::Me,
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

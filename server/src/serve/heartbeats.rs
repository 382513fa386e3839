//! Task heartbeats: leader memory, never written to the log.
//!
//! The leader remembers when it last heard from each task (a registration counts). A checker
//! proposes the ERROR transition for every connected task silent for the heartbeat timeout; the
//! transition itself is committed, so every replica agrees on it. A replica that becomes leader
//! forgets what it knew and gives every task a full timeout of grace from that moment, since the
//! old leader's memory is gone with it.
//!
//! Tasks are known by namespace and name (the same task name in two namespaces is two tasks); a
//! call's task is in the namespace the call is bound to.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use coord_raft_store::state::{TaskName, TaskState};
use coord_raft_store::storage::StateReader;
use coord_raft_store::Op;

use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::namespace::{self, Ns};
use crate::serve::proposer::Proposer;

/// A task of one namespace.
type Task = (Ns, TaskName);

/// The current call's `task`.
fn bound(task: &TaskName) -> Task {
    (namespace::current(), task.clone())
}

#[derive(Default)]
pub struct Heartbeats {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Last heartbeat per task, with the incarnation it came from.
    last: HashMap<Task, (u64, Instant)>,
    /// When this replica's current leadership began (grace for every task).
    since: Option<Instant>,
    /// Timeouts proposed and not yet seen applied, so each is proposed once.
    proposed: HashSet<(Task, u64)>,
    /// When each task last disconnected through this leader (ShutdownTask, ResetTask).
    disconnected: HashMap<Task, Instant>,
}

impl Heartbeats {
    pub fn record(&self, task: &TaskName, incarnation: u64) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.last.insert(bound(task), (incarnation, Instant::now()));
    }

    /// The task disconnected just now (its ShutdownTask or ResetTask committed).
    pub fn disconnected(&self, task: &TaskName) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.disconnected.insert(bound(task), Instant::now());
    }

    /// Whether the task disconnected through this leader less than `grace` ago: its agent may
    /// still have a heartbeat on the way, which TensorFlow's service accepts for one heartbeat
    /// timeout after the disconnect.
    pub fn disconnected_within(&self, task: &TaskName, grace: Duration) -> bool {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.disconnected
            .get(&bound(task))
            .is_some_and(|at| at.elapsed() < grace)
    }

    /// How long ago the task was last heard from with `incarnation` (leader memory only).
    pub fn age(&self, task: &TaskName, incarnation: u64) -> Option<Duration> {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        match g.last.get(&bound(task)) {
            Some((inc, at)) if *inc == incarnation => Some(at.elapsed()),
            _ => None,
        }
    }

    fn start_leading(&self) {
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        g.last.clear();
        g.proposed.clear();
        g.disconnected.clear();
        g.since = Some(Instant::now());
    }

    /// Connected tasks silent past their namespace's timeout, with their incarnation and
    /// silence.
    fn overdue(&self, connected: &[(Task, u64, Duration)]) -> Vec<(Task, u64, Duration)> {
        let now = Instant::now();
        let mut g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(since) = g.since else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (task, incarnation, timeout) in connected {
            let heard = match g.last.get(task) {
                Some((inc, at)) if inc == incarnation => (*at).max(since),
                _ => since,
            };
            let silent = now.saturating_duration_since(heard);
            if silent > *timeout && g.proposed.insert((task.clone(), *incarnation)) {
                out.push((task.clone(), *incarnation, silent));
            }
        }
        // Forget proposals for tasks that are no longer connected with that incarnation.
        let live: HashSet<(&Task, u64)> = connected.iter().map(|(t, i, _)| (t, *i)).collect();
        g.proposed.retain(|(t, i)| live.contains(&(t, *i)));
        out
    }
}

/// Every connected task of every namespace whose job has a heartbeat timeout, with its
/// incarnation and that timeout; and the shortest such timeout in ms (0: none).
fn connected_tasks(
    applied: &coord_raft_store::storage::Applied,
) -> (u64, Vec<(Task, u64, Duration)>) {
    let mut shortest = 0;
    let mut out = Vec::new();
    for (ns, space) in namespace::spaces(applied) {
        let Some(c) = &space.cluster else { continue };
        let timeout_ms = c.config.heartbeat_timeout_ms;
        if timeout_ms == 0 {
            continue;
        }
        shortest = if shortest == 0 {
            timeout_ms
        } else {
            shortest.min(timeout_ms)
        };
        out.extend(
            c.tasks
                .iter()
                .filter(|(_, r)| r.state == TaskState::Connected)
                .map(|(t, r)| {
                    (
                        (ns.clone(), t.clone()),
                        r.incarnation,
                        Duration::from_millis(timeout_ms),
                    )
                }),
        );
    }
    (shortest, out)
}

/// While this replica leads, puts silent tasks in ERROR.
pub async fn check(
    heartbeats: Arc<Heartbeats>,
    leader: LeaderWatch,
    reader: StateReader,
    proposer: Proposer,
) {
    let mut leading = false;
    loop {
        let (shortest_ms, connected) = reader.read(connected_tasks);
        // Look often (cheap: leader memory), so that a dead task is found within a quarter second
        // of its timeout.
        let every = Duration::from_millis((shortest_ms / 40).clamp(20, 250));
        let now_leading = leader.current() == Leadership::Me;
        if now_leading && !leading {
            heartbeats.start_leading();
        }
        leading = now_leading;
        if leading {
            for ((ns, task), incarnation, silent) in heartbeats.overdue(&connected) {
                tracing::warn!(namespace = namespace::shown(&ns), %task, silent_ms = silent.as_millis() as u64, "task missed its heartbeats; putting it in error");
                let op = Op::HeartbeatTimeout {
                    task,
                    incarnation,
                    silent_ms: u64::try_from(silent.as_millis()).unwrap_or(u64::MAX),
                };
                proposer.propose_decision(namespace::bind_to(&ns, op));
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_then_timeout_once_per_incarnation() {
        let h = Heartbeats::default();
        let t = TaskName::new("w", 0);
        let key: Task = (None, t.clone());
        let minute = Duration::from_secs(60);
        let ms = Duration::from_millis(1);
        assert!(
            h.overdue(&[(key.clone(), 1, Duration::ZERO)]).is_empty(),
            "not leading yet"
        );
        h.start_leading();
        h.record(&t, 1);
        assert!(h.overdue(&[(key.clone(), 1, minute)]).is_empty());
        std::thread::sleep(Duration::from_millis(5));
        let due = h.overdue(&[(key.clone(), 1, ms)]);
        assert_eq!(due.len(), 1);
        assert!(
            h.overdue(&[(key.clone(), 1, ms)]).is_empty(),
            "proposed once"
        );
        // A heartbeat from another incarnation does not count for this one.
        h.record(&t, 2);
        assert!(h.overdue(&[(key.clone(), 2, minute)]).is_empty());
        // Nor does one of the same task name in another namespace.
        let elsewhere: Task = (Some("a".into()), t.clone());
        assert_eq!(h.overdue(&[(elsewhere, 2, ms)]).len(), 1);
    }
}

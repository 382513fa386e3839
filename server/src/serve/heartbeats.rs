//! Task heartbeats: leader memory, never written to the log.
//!
//! The leader remembers when it last heard from each task (a registration counts). A checker
//! proposes the ERROR transition for every connected task silent for the heartbeat timeout; the
//! transition itself is committed, so every replica agrees on it. A replica that becomes leader
//! forgets what it knew and gives every task a full timeout of grace from that moment, since the
//! old leader's memory is gone with it.
//!
//! The checker's work per tick is the tasks whose timeout falls due then, not every task: each
//! checked task waits once in a queue ordered by when it would be overdue. When its time comes
//! and it was heard since, it goes back in at its new time. A job of 100,000 tasks with a 10 s
//! timeout costs about 10,000 such looks a second, and a tick with nothing due costs one. Only
//! the moment this replica begins to lead walks every connected task, to give each its grace.
//!
//! Silence is measured on the replica's own clock ([`StallClock`]): wall time less the time this
//! replica itself was stalled. The checker is what sees a stall, as its own tick waking late; a
//! replica that is always late still advances its clock by at least `TICK + STALL_SLACK` a tick.
//!
//! Tasks are known by namespace and name (the same task name in two namespaces is two tasks); a
//! call's task is in the namespace the call is bound to.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use coord_raft_store::state::{TaskName, TaskState};
use coord_raft_store::storage::StateReader;
use coord_raft_store::Op;

use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::namespace::{self, Ns};
use crate::serve::proposer::Proposer;
use crate::serve::stall::StallClock;

/// A task of one namespace.
type Task = (Ns, TaskName);

/// The current call's `task`.
fn bound(task: &TaskName) -> Task {
    (namespace::current(), task.clone())
}

/// How often the checker looks for tasks that fell due: a dead task is put in error within about
/// this of its timeout.
const TICK: Duration = Duration::from_millis(20);

#[derive(Default)]
pub struct Heartbeats {
    inner: Mutex<Inner>,
    /// The replica's clock, which this checker keeps (and the dispatcher's timers read).
    clock: Arc<StallClock>,
}

/// What the leader last heard from a task. Instants here are on the replica's clock
/// ([`StallClock`]).
struct Heard {
    incarnation: u64,
    at: Instant,
    /// The heartbeat timeout of the task's namespace (zero: none, the task is not checked).
    timeout: Duration,
    /// The task has its place in [`Inner::due`].
    queued: bool,
    /// Heard indeed, not only given grace when this leadership began.
    heard: bool,
}

/// A task's place in the queue: when it falls due unless heard from again.
struct Due(Instant, Task);

impl PartialEq for Due {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Due {}

impl PartialOrd for Due {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Due {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp(&other.0)
    }
}

/// A task that fell due: not heard from (with `incarnation`) since `heard`, for its timeout.
#[derive(Debug, PartialEq, Eq)]
struct Fell {
    task: Task,
    incarnation: u64,
    heard: Instant,
    timeout: Duration,
}

#[derive(Default)]
struct Inner {
    /// Last heard per task; a task connected when this leadership began counts as heard then.
    last: HashMap<Task, Heard>,
    /// Every checked task once, earliest due first.
    due: BinaryHeap<Reverse<Due>>,
    /// When this replica's current leadership began (grace for every task).
    since: Option<Instant>,
    /// When each task last disconnected through this leader (ShutdownTask, ResetTask), wall clock.
    disconnected: HashMap<Task, Instant>,
}

impl Inner {
    /// Notes `task` heard at `at`, queueing it if it is checked and not queued already.
    fn heard(&mut self, task: Task, incarnation: u64, timeout: Duration, at: Instant) {
        let queue = if let Some(h) = self.last.get_mut(&task) {
            (h.incarnation, h.at, h.timeout, h.heard) = (incarnation, at, timeout, true);
            let queue = !h.queued && !timeout.is_zero();
            h.queued |= queue;
            queue
        } else {
            let queue = !timeout.is_zero();
            let heard = Heard {
                incarnation,
                at,
                timeout,
                queued: queue,
                heard: true,
            };
            self.last.insert(task.clone(), heard);
            queue
        };
        if queue {
            self.due.push(Reverse(Due(at + timeout, task)));
        }
    }

    /// Takes out of the queue every task due by `now`: one heard since goes back in at its new
    /// time, one not heard is returned (and stays out until [`Inner::again`] or a heartbeat).
    fn fell_due(&mut self, now: Instant) -> Vec<Fell> {
        let mut out = Vec::new();
        while self
            .due
            .peek()
            .is_some_and(|Reverse(Due(at, _))| *at <= now)
        {
            let Some(Reverse(Due(_, task))) = self.due.pop() else {
                break;
            };
            let Some(h) = self.last.get_mut(&task) else {
                continue;
            };
            let next = h.at + h.timeout;
            if next > now && !h.timeout.is_zero() {
                self.due.push(Reverse(Due(next, task)));
                continue;
            }
            h.queued = false;
            if !h.timeout.is_zero() {
                out.push(Fell {
                    incarnation: h.incarnation,
                    heard: h.at,
                    timeout: h.timeout,
                    task,
                });
            }
        }
        out
    }

    /// Puts `task` back in the queue a timeout from `now`, unless it is there already: a task put
    /// in error is looked at again in case the proposal was lost.
    fn again(&mut self, task: Task, now: Instant) {
        if let Some(h) = self.last.get_mut(&task) {
            if !h.queued && !h.timeout.is_zero() {
                h.queued = true;
                self.due.push(Reverse(Due(now + h.timeout, task)));
            }
        }
    }

    /// This replica began to lead at wall-clock `wall`, `since` on the replica's clock, with
    /// `connected` the connected tasks then: what an earlier leadership heard is forgotten, what
    /// this one heard already is kept, and every connected task not heard yet counts as heard at
    /// `since`.
    fn start_leading(
        &mut self,
        wall: Instant,
        since: Instant,
        connected: Vec<(Task, u64, Duration)>,
    ) {
        self.last.retain(|_, h| h.at >= since);
        self.disconnected.retain(|_, at| *at >= wall);
        self.due.clear();
        for (task, incarnation, timeout) in connected {
            self.last.entry(task).or_insert(Heard {
                incarnation,
                at: since,
                timeout,
                queued: false,
                heard: false,
            });
        }
        let Inner { last, due, .. } = self;
        for (task, h) in last.iter_mut() {
            h.queued = !h.timeout.is_zero();
            if h.queued {
                due.push(Reverse(Due(h.at + h.timeout, task.clone())));
            }
        }
        self.since = Some(since);
    }
}

impl Heartbeats {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `task` (of the current call's namespace, whose heartbeat timeout is `timeout`) was heard
    /// from just now.
    pub fn record(&self, task: &TaskName, incarnation: u64, timeout: Duration) {
        let at = self.clock.now();
        self.inner().heard(bound(task), incarnation, timeout, at);
    }

    /// The replica's clock this checker keeps.
    pub fn clock(&self) -> Arc<StallClock> {
        self.clock.clone()
    }

    /// How long this replica has been stalled in all (`coord_replica_stalled_seconds_total`).
    pub fn stalled(&self) -> Duration {
        self.clock.stalled()
    }

    /// The task disconnected just now (its ShutdownTask or ResetTask committed).
    pub fn disconnected(&self, task: &TaskName) {
        self.inner()
            .disconnected
            .insert(bound(task), Instant::now());
    }

    /// Whether the task disconnected through this leader less than `grace` ago: its agent may
    /// still have a heartbeat on the way, which TensorFlow's service accepts for one heartbeat
    /// timeout after the disconnect.
    pub fn disconnected_within(&self, task: &TaskName, grace: Duration) -> bool {
        self.inner()
            .disconnected
            .get(&bound(task))
            .is_some_and(|at| at.elapsed() < grace)
    }

    /// How long ago the task was last heard from with `incarnation` (leader memory only).
    pub fn age(&self, task: &TaskName, incarnation: u64) -> Option<Duration> {
        let now = self.clock.now();
        match self.inner().last.get(&bound(task)) {
            Some(h) if h.heard && h.incarnation == incarnation => {
                Some(now.saturating_duration_since(h.at))
            }
            _ => None,
        }
    }
}

/// Every connected task of every namespace whose job has a heartbeat timeout, with its
/// incarnation and that timeout.
fn connected_tasks(applied: &coord_raft_store::storage::Applied) -> Vec<(Task, u64, Duration)> {
    let mut out = Vec::new();
    for (ns, space) in namespace::spaces(applied) {
        let Some(c) = &space.cluster else { continue };
        let timeout = Duration::from_millis(c.config.heartbeat_timeout_ms);
        if timeout.is_zero() {
            continue;
        }
        out.extend(
            c.tasks
                .iter()
                .filter(|(_, r)| r.state == TaskState::Connected)
                .map(|(t, r)| ((ns.clone(), t.clone()), r.incarnation, timeout)),
        );
    }
    out
}

/// The incarnation `task` is connected with, if it is.
fn connected_incarnation(applied: &coord_raft_store::storage::Applied, task: &Task) -> Option<u64> {
    let cluster = namespace::space_of(applied, &task.0).cluster.as_ref()?;
    cluster
        .tasks
        .get(&task.1)
        .filter(|r| r.state == TaskState::Connected)
        .map(|r| r.incarnation)
}

/// While this replica leads, puts silent tasks in ERROR.
pub async fn check(
    heartbeats: Arc<Heartbeats>,
    leader: LeaderWatch,
    reader: StateReader,
    proposer: Proposer,
) {
    let mut leading = false;
    let mut woke = Instant::now();
    loop {
        // Wake to wake, so a stop that lands while the checker works counts too.
        let last = std::mem::replace(&mut woke, Instant::now());
        let late = woke.saturating_duration_since(last).saturating_sub(TICK);
        heartbeats.clock.woke_late(late);
        let now_leading = leader.current() == Leadership::Me;
        if now_leading && !leading {
            let since = leader
                .leading_since()
                .map_or_else(Instant::now, tokio::time::Instant::into_std);
            let connected = reader.read(connected_tasks);
            let on_clock = heartbeats.clock.at(since);
            heartbeats.inner().start_leading(since, on_clock, connected);
        }
        leading = now_leading;
        if leading {
            let (now, fell, since) = {
                let now = heartbeats.clock.now();
                let mut g = heartbeats.inner();
                (now, g.fell_due(now), g.since.unwrap_or(now))
            };
            for f in fell {
                // Only a task still connected is put in error. One connected with another
                // incarnation than the one last heard from was not heard from since this
                // leadership began.
                let Some(incarnation) = reader.read(|a| connected_incarnation(a, &f.task)) else {
                    continue;
                };
                let heard = if incarnation == f.incarnation {
                    f.heard
                } else {
                    since
                };
                let silent = now.saturating_duration_since(heard);
                if silent > f.timeout {
                    let (ns, task) = f.task.clone();
                    tracing::warn!(namespace = namespace::shown(&ns), %task, silent_ms = silent.as_millis() as u64, "task missed its heartbeats; putting it in error");
                    let op = Op::HeartbeatTimeout {
                        task,
                        incarnation,
                        silent_ms: u64::try_from(silent.as_millis()).unwrap_or(u64::MAX),
                    };
                    proposer.propose_decision(namespace::bind_to(&ns, op));
                }
                heartbeats.inner().again(f.task, now);
            }
        }
        tokio::time::sleep(TICK).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fell(inner: &mut Inner, at: Instant) -> Vec<(Task, u64)> {
        inner
            .fell_due(at)
            .into_iter()
            .map(|f| (f.task, f.incarnation))
            .collect()
    }

    #[test]
    fn a_connected_task_gets_grace_then_falls_due_once() {
        let mut inner = Inner::default();
        let t: Task = (None, TaskName::new("w", 0));
        let t0 = Instant::now();
        let sec = Duration::from_secs(1);
        inner.start_leading(t0, t0, vec![(t.clone(), 1, 10 * sec)]);
        assert!(!inner.last[&t].heard, "given grace, not heard from");
        assert!(fell(&mut inner, t0 + 9 * sec).is_empty(), "grace");
        assert_eq!(fell(&mut inner, t0 + 11 * sec), vec![(t.clone(), 1)]);
        assert!(
            fell(&mut inner, t0 + 30 * sec).is_empty(),
            "out of the queue"
        );
        // Looked at again a timeout later, in case the proposal was lost.
        inner.again(t.clone(), t0 + 30 * sec);
        assert_eq!(fell(&mut inner, t0 + 41 * sec), vec![(t, 1)]);
    }

    #[test]
    fn a_task_heard_again_goes_back_in_at_its_new_time() {
        let mut inner = Inner::default();
        let t: Task = (None, TaskName::new("w", 0));
        let t0 = Instant::now();
        let sec = Duration::from_secs(1);
        inner.start_leading(t0, t0, Vec::new());
        inner.heard(t.clone(), 1, 10 * sec, t0);
        for beat in 1..20 {
            inner.heard(t.clone(), 1, 10 * sec, t0 + beat * sec);
        }
        assert_eq!(inner.due.len(), 1, "queued once, however often heard");
        assert!(fell(&mut inner, t0 + 25 * sec).is_empty());
        assert_eq!(fell(&mut inner, t0 + 30 * sec), vec![(t.clone(), 1)]);
        // A task of a namespace without a timeout is never queued.
        let unchecked: Task = (Some("a".into()), TaskName::new("w", 0));
        inner.heard(unchecked, 1, Duration::ZERO, t0);
        assert!(inner.due.is_empty());
        assert!(fell(&mut inner, t0 + 100 * sec).is_empty());
    }

    #[test]
    fn the_replicas_own_stall_is_not_counted_as_silence() {
        let heartbeats = Heartbeats::default();
        let t: Task = (None, TaskName::new("w", 0));
        let sec = Duration::from_secs(1);
        let t0 = Instant::now();
        heartbeats.inner().heard(t.clone(), 1, 10 * sec, t0);
        // The process stopped for 5 s: the task is silent 5 s longer before it falls due.
        heartbeats
            .clock
            .woke_late(5 * sec + crate::serve::stall::STALL_SLACK);
        assert_eq!(heartbeats.stalled(), 5 * sec);
        let clock = heartbeats.clock();
        let (early, due) = (clock.at(t0 + 14 * sec), clock.at(t0 + 16 * sec));
        let mut g = heartbeats.inner();
        assert!(
            fell(&mut g, early).is_empty(),
            "14 s of wall time, 9 of silence"
        );
        assert_eq!(fell(&mut g, due), vec![(t, 1)]);
    }

    #[test]
    fn a_new_leadership_forgets_the_last_one_but_not_its_own() {
        let mut inner = Inner::default();
        let sec = Duration::from_secs(1);
        let (old, new): (Task, Task) =
            ((None, TaskName::new("w", 0)), (None, TaskName::new("w", 1)));
        let t0 = Instant::now();
        inner.heard(old.clone(), 1, 10 * sec, t0);
        // Registered through this leader just before its checker saw it lead.
        inner.heard(new.clone(), 7, 10 * sec, t0 + 5 * sec);
        inner.start_leading(t0 + 4 * sec, t0 + 4 * sec, vec![(old.clone(), 1, 10 * sec)]);
        assert!(fell(&mut inner, t0 + 13 * sec).is_empty(), "grace from 4 s");
        assert_eq!(fell(&mut inner, t0 + 14 * sec), vec![(old, 1)]);
        assert_eq!(fell(&mut inner, t0 + 15 * sec), vec![(new, 7)]);
    }
}

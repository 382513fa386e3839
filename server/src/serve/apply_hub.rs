//! Where apply's effects reach the server: the state machine reports every applied batch here,
//! after releasing the state lock, and the hub wakes the parked calls it concerns and hands barrier
//! deadlines to the leader's timer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use coord_raft_store::storage::ApplyListener;
use coord_raft_store::types::LogId;
use coord_raft_store::Change;
use tokio::sync::mpsc;

use crate::serve::parked::{ParkBudget, WaitRegistry, Wake};
use crate::serve::watch_hub::{EventKind, KvEvent, WatchHub};

/// Blocking gets, by key; woken with the inserted value.
pub type KvWaiters = WaitRegistry<String, Bytes>;
/// Barrier waits, by (barrier id, instance counter); woken when the instance finished.
pub type BarrierWaiters = WaitRegistry<(String, i64), ()>;
/// Error polls; woken with the sequence number of each new error.
pub type ErrorWaiters = WaitRegistry<(), u64>;
/// Task watches (XLA's WatchTasks); woken whenever a task's record changed.
pub type TaskWaiters = WaitRegistry<(), ()>;
/// Waits on raw keys (a multi-key wait, a counted barrier, a blocking pop), by the key each is
/// parked on; woken whenever that key's value or queue changed, to look again.
pub type RawWaiters = WaitRegistry<Bytes, ()>;

/// A barrier instance with a deadline, for the leader's timer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deadline {
    pub id: String,
    pub counter: i64,
    pub at_ms: u64,
}

pub struct ApplyHub {
    /// Bounds the parked calls of every registry below and the watch streams together.
    pub budget: Arc<ParkBudget>,
    pub kv: Arc<KvWaiters>,
    pub barriers: Arc<BarrierWaiters>,
    pub errors: Arc<ErrorWaiters>,
    pub tasks: Arc<TaskWaiters>,
    pub raw: Arc<RawWaiters>,
    /// Key-value changes for watches.
    pub watches: Arc<WatchHub>,
    /// Read access to the state, set once storage is open (to restart watch history after a
    /// snapshot replaced the state).
    reader: std::sync::OnceLock<coord_raft_store::storage::StateReader>,
    deadlines_tx: mpsc::UnboundedSender<Deadline>,
    deadlines_rx: Mutex<Option<mpsc::UnboundedReceiver<Deadline>>>,
    /// The last applied log index, for metrics.
    pub applied_index: AtomicU64,
}

impl ApplyHub {
    /// A hub whose parked calls and watches are bounded by `max_parked` (0: no bound).
    pub fn new(max_parked: usize) -> Arc<Self> {
        let (deadlines_tx, rx) = mpsc::unbounded_channel();
        let budget = ParkBudget::new(max_parked);
        Arc::new(Self {
            kv: Arc::new(WaitRegistry::new(budget.clone())),
            barriers: Arc::new(WaitRegistry::new(budget.clone())),
            errors: Arc::new(WaitRegistry::new(budget.clone())),
            tasks: Arc::new(WaitRegistry::new(budget.clone())),
            raw: Arc::new(WaitRegistry::new(budget.clone())),
            budget,
            watches: Arc::default(),
            reader: std::sync::OnceLock::new(),
            deadlines_tx,
            deadlines_rx: Mutex::new(Some(rx)),
            applied_index: AtomicU64::new(0),
        })
    }

    /// Gives the hub the opened state: watch history starts at its current revision.
    pub fn attach(&self, reader: coord_raft_store::storage::StateReader) {
        self.watches
            .restart_at(reader.read(|a| a.state.kv.revision()));
        let _ = self.reader.set(reader);
    }

    /// The stream of barrier deadlines (taken once, by the barrier timer).
    pub fn take_deadlines(&self) -> Option<mpsc::UnboundedReceiver<Deadline>> {
        self.deadlines_rx
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Every parked call, of every kind.
    pub fn parked(&self) -> usize {
        self.kv.len() + self.barriers.len() + self.errors.len() + self.tasks.len() + self.raw.len()
    }

    /// This replica stopped leading: every parked call fails so that it is re-driven elsewhere.
    pub fn leadership_lost(&self) {
        self.kv.wake_all(|| Wake::LeaderLost);
        self.barriers.wake_all(|| Wake::LeaderLost);
        self.errors.wake_all(|| Wake::LeaderLost);
        self.tasks.wake_all(|| Wake::LeaderLost);
        self.raw.wake_all(|| Wake::LeaderLost);
    }
}

impl ApplyHub {
    /// One log line per task state change (on every replica, as it applies it).
    fn log_task(&self, task: &coord_raft_store::state::TaskName) {
        let Some(reader) = self.reader.get() else {
            return;
        };
        let rec = reader.read(|a| a.state.cluster.as_ref()?.tasks.get(task).cloned());
        if let Some(r) = rec {
            let state = r.state.name();
            match &r.error {
                Some(e) => {
                    tracing::info!(%task, state, incarnation = format!("{:#x}", r.incarnation), error = %e.message, "task state")
                }
                None => {
                    tracing::info!(%task, state, incarnation = format!("{:#x}", r.incarnation), "task state")
                }
            }
        }
    }

    /// One log line per barrier outcome.
    fn log_barrier(&self, id: &str, counter: i64) {
        let Some(reader) = self.reader.get() else {
            return;
        };
        let outcome = reader.read(|a| {
            a.state
                .cluster
                .as_ref()?
                .barriers
                .get(id)?
                .outcome_of(counter)
                .cloned()
        });
        match outcome {
            Some(coord_raft_store::state::Outcome::Passed) => {
                tracing::info!(barrier = id, counter, "barrier passed")
            }
            Some(coord_raft_store::state::Outcome::Failed { code, message }) => {
                tracing::info!(barrier = id, counter, ?code, %message, "barrier failed")
            }
            // GetAliveTasks rounds share the barrier wake-ups; they are not barriers.
            None => tracing::debug!(round = id, counter, "round finished"),
        }
    }
}

impl ApplyListener for ApplyHub {
    fn applied(&self, last: LogId, changes: &[Change]) {
        self.applied_index.store(last.index, Ordering::Relaxed);
        let mut kv_events = Vec::new();
        for change in changes {
            match change {
                Change::KvPut {
                    key,
                    value,
                    revision,
                } => {
                    self.kv.wake(key, value);
                    kv_events.push(KvEvent {
                        kind: EventKind::Put,
                        key: key.clone(),
                        value: value.clone(),
                        revision: *revision,
                    });
                }
                Change::KvDelete { key, revision } => kv_events.push(KvEvent {
                    kind: EventKind::Delete,
                    key: key.clone(),
                    value: Bytes::new(),
                    revision: *revision,
                }),
                Change::BarrierDone { id, counter } => {
                    self.log_barrier(id, *counter);
                    self.barriers.wake(&(id.clone(), *counter), &())
                }
                Change::ErrorRaised { seq } => self.errors.wake(&(), seq),
                Change::RunStarted { number } => {
                    tracing::info!(run = number, "a new run of the coordinated job began");
                    // The last run's barrier instances and rounds are gone: their waiters look
                    // again (and are told their run ended).
                    self.barriers.wake_all(|| Wake::Recheck);
                }
                Change::RawChanged { key } => self.raw.wake(key, &()),
                Change::TaskChanged { task } => {
                    self.log_task(task);
                    self.tasks.wake(&(), &())
                }
                Change::BarrierStarted {
                    id,
                    counter,
                    deadline_ms: Some(at_ms),
                } => {
                    let _ = self.deadlines_tx.send(Deadline {
                        id: id.clone(),
                        counter: *counter,
                        at_ms: *at_ms,
                    });
                }
                _ => {}
            }
        }
        self.watches.record(kv_events);
    }

    fn replaced(&self, last: Option<LogId>) {
        self.applied_index
            .store(last.map_or(0, |l| l.index), Ordering::Relaxed);
        self.kv.wake_all(|| Wake::Recheck);
        self.barriers.wake_all(|| Wake::Recheck);
        self.errors.wake_all(|| Wake::Recheck);
        self.tasks.wake_all(|| Wake::Recheck);
        self.raw.wake_all(|| Wake::Recheck);
        if let Some(reader) = self.reader.get() {
            self.watches
                .restart_at(reader.read(|a| a.state.kv.revision()));
        }
    }
}

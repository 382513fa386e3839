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

use crate::serve::namespace::{self, Ns};
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
    /// The namespace of the barrier.
    pub ns: Ns,
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
    /// Key-value changes of the default namespace, for watches.
    pub watches: Arc<WatchHub>,
    /// Key-value changes of named namespaces, each made when the namespace's first watch starts
    /// (a namespace nobody watches keeps no history).
    ns_watches: Mutex<std::collections::HashMap<Arc<str>, Arc<WatchHub>>>,
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
            ns_watches: Mutex::default(),
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
        self.sync_namespace_bounds();
    }

    fn ns_watches(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<Arc<str>, Arc<WatchHub>>> {
        self.ns_watches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The key watches of namespace `ns`; a named namespace's start at its current revision.
    pub fn watches_of(&self, ns: &Ns) -> Arc<WatchHub> {
        let Some(name) = ns else {
            return self.watches.clone();
        };
        let mut all = self.ns_watches();
        if let Some(hub) = all.get(name) {
            return hub.clone();
        }
        let hub = Arc::new(WatchHub::default());
        if let Some(reader) = self.reader.get() {
            hub.restart_at(reader.read(|a| namespace::space_of(a, ns).kv.revision()));
        }
        all.insert(name.clone(), hub.clone());
        hub
    }

    /// Gives the park budget every namespace's bound on parked calls, as the state has them.
    fn sync_namespace_bounds(&self) {
        let Some(reader) = self.reader.get() else {
            return;
        };
        let bounds: Vec<(String, u64)> = reader.read(|a| {
            a.state
                .namespaces
                .iter()
                .map(|(name, n)| (name.clone(), n.limits.max_parked))
                .collect()
        });
        self.budget
            .retain_namespaces(|name| bounds.iter().any(|(n, _)| n == name));
        self.ns_watches()
            .retain(|name, _| bounds.iter().any(|(n, _)| n.as_str() == &**name));
        for (name, max) in bounds {
            self.budget
                .set_namespace_bound(&name, usize::try_from(max).unwrap_or(usize::MAX));
        }
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
    fn log_task(&self, ns: &Ns, task: &coord_raft_store::state::TaskName) {
        let Some(reader) = self.reader.get() else {
            return;
        };
        let rec = reader.read(|a| {
            namespace::space_of(a, ns)
                .cluster
                .as_ref()?
                .tasks
                .get(task)
                .cloned()
        });
        let ns = namespace::shown(ns);
        if let Some(r) = rec {
            let state = r.state.name();
            match &r.error {
                Some(e) => {
                    tracing::info!(namespace = ns, %task, state, incarnation = format!("{:#x}", r.incarnation), error = %e.message, "task state")
                }
                None => {
                    tracing::info!(namespace = ns, %task, state, incarnation = format!("{:#x}", r.incarnation), "task state")
                }
            }
        }
    }

    /// One log line per barrier outcome.
    fn log_barrier(&self, ns: &Ns, id: &str, counter: i64) {
        let Some(reader) = self.reader.get() else {
            return;
        };
        let outcome = reader.read(|a| {
            namespace::space_of(a, ns)
                .cluster
                .as_ref()?
                .barriers
                .get(id)?
                .outcome_of(counter)
                .cloned()
        });
        let ns = namespace::shown(ns);
        match outcome {
            Some(coord_raft_store::state::Outcome::Passed) => {
                tracing::info!(namespace = ns, barrier = id, counter, "barrier passed")
            }
            Some(coord_raft_store::state::Outcome::Failed { code, message }) => {
                tracing::info!(namespace = ns, barrier = id, counter, ?code, %message, "barrier failed")
            }
            // GetAliveTasks rounds share the barrier wake-ups; they are not barriers.
            None => tracing::debug!(round = id, counter, "round finished"),
        }
    }
}

impl ApplyHub {
    /// Wakes what `change`, made in namespace `ns`, concerns. Key changes go to `kv_events`, for
    /// watches.
    fn on_change(&self, ns: &Ns, change: &Change, kv_events: &mut Vec<(Ns, KvEvent)>) {
        match change {
            Change::KvPut {
                key,
                value,
                revision,
            } => {
                self.kv.wake_in(ns, key, value);
                kv_events.push((
                    ns.clone(),
                    KvEvent {
                        kind: EventKind::Put,
                        key: key.clone(),
                        value: value.clone(),
                        revision: *revision,
                    },
                ));
            }
            Change::KvDelete { key, revision } => kv_events.push((
                ns.clone(),
                KvEvent {
                    kind: EventKind::Delete,
                    key: key.clone(),
                    value: Bytes::new(),
                    revision: *revision,
                },
            )),
            Change::BarrierDone { id, counter } => {
                self.log_barrier(ns, id, *counter);
                self.barriers.wake_in(ns, &(id.clone(), *counter), &())
            }
            Change::ErrorRaised { seq } => self.errors.wake_in(ns, &(), seq),
            Change::RunStarted { number } => {
                tracing::info!(
                    namespace = namespace::shown(ns),
                    run = number,
                    "a new run of the coordinated job began"
                );
                // The last run's barrier instances and rounds are gone: their waiters look
                // again (and are told their run ended).
                self.barriers.wake_namespace(ns, || Wake::Recheck);
            }
            Change::RawChanged { key } => self.raw.wake_in(ns, key, &()),
            Change::TaskChanged { task } => {
                self.log_task(ns, task);
                self.tasks.wake_in(ns, &(), &())
            }
            Change::BarrierStarted {
                id,
                counter,
                deadline_ms: Some(at_ms),
            } => {
                let _ = self.deadlines_tx.send(Deadline {
                    ns: ns.clone(),
                    id: id.clone(),
                    counter: *counter,
                    at_ms: *at_ms,
                });
            }
            Change::InNamespace { namespace, change } if ns.is_none() => {
                self.on_change(&Some(namespace.as_str().into()), change, kv_events)
            }
            Change::NamespaceDeclared { namespace } => {
                tracing::info!(namespace = namespace.as_str(), "namespace declared");
                self.sync_namespace_bounds();
            }
            Change::NamespaceDeleted { namespace } => {
                tracing::info!(namespace = namespace.as_str(), "namespace deleted");
                self.sync_namespace_bounds();
                // Its parked calls are driven again, and find it gone.
                let gone: Ns = Some(namespace.as_str().into());
                self.kv.wake_namespace(&gone, || Wake::LeaderLost);
                self.barriers.wake_namespace(&gone, || Wake::LeaderLost);
                self.errors.wake_namespace(&gone, || Wake::LeaderLost);
                self.tasks.wake_namespace(&gone, || Wake::LeaderLost);
                self.raw.wake_namespace(&gone, || Wake::LeaderLost);
            }
            _ => {}
        }
    }
}

impl ApplyHub {
    /// Records key changes for the watches of their namespaces (a named namespace's only while
    /// it has watch history).
    fn record_watched(&self, events: Vec<(Ns, KvEvent)>) {
        if events.iter().all(|(ns, _)| ns.is_none()) {
            self.watches
                .record(events.into_iter().map(|(_, e)| e).collect());
            return;
        }
        let mut by_ns: std::collections::BTreeMap<Ns, Vec<KvEvent>> = Default::default();
        for (ns, e) in events {
            by_ns.entry(ns).or_default().push(e);
        }
        for (ns, events) in by_ns {
            let hub = match &ns {
                None => Some(self.watches.clone()),
                Some(name) => self.ns_watches().get(name).cloned(),
            };
            if let Some(hub) = hub {
                hub.record(events);
            }
        }
    }
}

impl ApplyListener for ApplyHub {
    fn applied(&self, last: LogId, changes: &[Change]) {
        self.applied_index.store(last.index, Ordering::Relaxed);
        let mut kv_events = Vec::new();
        for change in changes {
            self.on_change(&None, change, &mut kv_events);
        }
        self.record_watched(kv_events);
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
            for (name, hub) in self.ns_watches().iter() {
                let ns: Ns = Some(name.clone());
                hub.restart_at(reader.read(|a| namespace::space_of(a, &ns).kv.revision()));
            }
        }
        self.sync_namespace_bounds();
    }
}

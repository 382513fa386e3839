//! Parked calls: leader-local waits that apply wakes.
//!
//! A call that must wait for the state to change (a blocking get for a missing key, a barrier
//! arrival, an error poll) registers here under a key and sleeps. When apply makes the change, the
//! [`ApplyHub`](crate::serve::apply_hub::ApplyHub) wakes the waiters of that key. When this replica stops
//! leading, every waiter is told `LeaderLost`, so routing re-drives the call on the new leader
//! (DESIGN: parked RPCs live in leader memory).
//!
//! The check that a caller must wait and its registration happen under the state's read lock, and
//! apply wakes waiters only after releasing its write lock, so no change can slip between the
//! check and the registration.
//!
//! Every parked call and watch stream holds leader memory (3–5 KB each for a TensorFlow barrier or
//! WaitForAllTasks call: its own future, the HTTP/2 stream and hyper's task), so together they are
//! bounded by one [`ParkBudget`]
//! (`--max-parked-calls`) across all clients: per-client caps alone let more clients grow the
//! leader without limit. A call takes its [`Slot`] when it first parks and keeps it until it
//! returns, so a call already waiting is never refused when it parks again after a wake.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use crate::error::CoordError;
use crate::serve::namespace::{self, Ns};

#[derive(Debug)]
pub enum Wake<V> {
    /// The awaited change happened; it carries what the waiter needs, if anything.
    Changed(V),
    /// The state was replaced wholesale (snapshot install): look again.
    Recheck,
    /// This replica stopped leading.
    LeaderLost,
}

/// The bound on parked calls and watch streams this replica holds, across all clients, and each
/// namespace's own bound within it.
pub struct ParkBudget {
    /// 0: no bound.
    max: usize,
    used: AtomicUsize,
    refused: AtomicU64,
    /// Slots held per named namespace, and its bound (0: none but the whole budget's).
    namespaces: Mutex<HashMap<Arc<str>, NamespaceSlots>>,
}

#[derive(Default, Clone, Copy)]
struct NamespaceSlots {
    used: usize,
    max: usize,
}

/// One parked call's or watch's place in the [`ParkBudget`] (and in its namespace's share);
/// given back when dropped.
pub struct Slot(Arc<ParkBudget>, Ns);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.used.fetch_sub(1, Ordering::Relaxed);
        if let Some(ns) = &self.1 {
            if let Some(n) = self.0.namespaces().get_mut(ns) {
                n.used = n.used.saturating_sub(1);
            }
        }
    }
}

impl ParkBudget {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max,
            used: AtomicUsize::new(0),
            refused: AtomicU64::new(0),
            namespaces: Mutex::default(),
        })
    }

    fn namespaces(&self) -> MutexGuard<'_, HashMap<Arc<str>, NamespaceSlots>> {
        self.namespaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets namespace `name`'s bound (0: none but the whole budget's); its slots in use stay.
    pub fn set_namespace_bound(&self, name: &str, max: usize) {
        self.namespaces().entry(Arc::from(name)).or_default().max = max;
    }

    /// Keeps the namespaces `keep` says to keep (the others were deleted).
    pub fn retain_namespaces(&self, keep: impl Fn(&str) -> bool) {
        self.namespaces().retain(|name, _| keep(name));
    }

    /// A slot for a call of the current namespace, or `None` when every slot is taken, or every
    /// slot of its namespace (counted as a refusal).
    pub fn take(self: &Arc<Self>) -> Option<Slot> {
        let ns = namespace::current();
        if let Some(name) = &ns {
            let mut all = self.namespaces();
            let n = all.entry(name.clone()).or_default();
            if n.max != 0 && n.used >= n.max {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            n.used += 1;
        }
        let taken = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (self.max == 0 || n < self.max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Some(Slot(self.clone(), ns)),
            Err(_) => {
                if let Some(name) = &ns {
                    if let Some(n) = self.namespaces().get_mut(name) {
                        n.used = n.used.saturating_sub(1);
                    }
                }
                self.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Slots the calls of namespace `ns` hold.
    pub fn used_in(&self, ns: &Ns) -> usize {
        match ns {
            None => {
                let named: usize = self.namespaces().values().map(|n| n.used).sum();
                self.used().saturating_sub(named)
            }
            Some(name) => self.namespaces().get(name).map_or(0, |n| n.used),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Slots held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Calls and watches refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The error a refused `what` ("GetKeyValue of key \"k\"") of the current namespace
    /// answers: RESOURCE_EXHAUSTED, naming the bound it met.
    pub fn refusal(&self, what: &str) -> CoordError {
        if let Some(name) = namespace::current() {
            let n = self.namespaces().get(&name).copied().unwrap_or_default();
            if n.max != 0 && n.used >= n.max {
                return CoordError::ResourceExhausted(format!(
                    "namespace {name:?} already holds {} parked calls and watches, its limit (max_parked {}); {what} refused, retry later",
                    n.used, n.max
                ));
            }
        }
        CoordError::ResourceExhausted(format!(
            "this leader already holds {} parked calls and watches, its bound across all clients (--max-parked-calls {}); {what} refused, retry later",
            self.used(),
            self.max
        ))
    }
}

/// Why [`WaitRegistry::park`] did not park.
#[derive(Debug, PartialEq, Eq)]
pub enum NotParked {
    /// Leadership was lost since the caller's epoch.
    LeaderLost,
    /// The [`ParkBudget`] is spent.
    Full,
}

pub struct WaitRegistry<K, V> {
    inner: Mutex<Inner<K, V>>,
    budget: Arc<ParkBudget>,
    /// Mirror of the number of waiters, so apply skips the lock when nobody waits (the usual
    /// case for keys).
    parked: AtomicUsize,
}

type Waiters<V> = Vec<(u64, oneshot::Sender<Wake<V>>)>;

struct Inner<K, V> {
    /// Waiters by namespace and key: a call parks in the namespace it is bound to.
    by_key: HashMap<(Ns, K), Waiters<V>>,
    next_id: u64,
    /// Bumped every time leadership is lost; a call that confirmed leadership in an older epoch
    /// may not park.
    epoch: u64,
    count: usize,
}

impl<K, V> WaitRegistry<K, V> {
    /// A registry whose waiters take their slots from `budget`.
    pub fn new(budget: Arc<ParkBudget>) -> Self {
        Self {
            budget,
            inner: Mutex::new(Inner {
                by_key: HashMap::new(),
                next_id: 0,
                epoch: 0,
                count: 0,
            }),
            parked: AtomicUsize::new(0),
        }
    }
}

/// A registered waiter; dropping it (the call finished or was cancelled) unregisters it.
pub struct Parked<K: Hash + Eq + Clone, V> {
    registry: Arc<WaitRegistry<K, V>>,
    key: (Ns, K),
    id: u64,
    rx: oneshot::Receiver<Wake<V>>,
}

impl<K: Hash + Eq + Clone, V: Clone> WaitRegistry<K, V> {
    fn lock(&self) -> MutexGuard<'_, Inner<K, V>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn epoch(&self) -> u64 {
        self.lock().epoch
    }

    pub fn budget(&self) -> &Arc<ParkBudget> {
        &self.budget
    }

    /// What a caller that could not park answers; `what` names the call for a refusal.
    pub fn not_parked(&self, why: NotParked, what: impl FnOnce() -> String) -> CoordError {
        match why {
            NotParked::LeaderLost => CoordError::LeaderChanged,
            NotParked::Full => self.budget.refusal(&what()),
        }
    }

    pub fn len(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a waiter for `key` in the current namespace, unless leadership was lost since
    /// `epoch` or the budget is spent. The caller's `slot` is taken on its first park and kept
    /// across re-parks.
    pub fn park(
        self: &Arc<Self>,
        key: &K,
        epoch: u64,
        slot: &mut Option<Slot>,
    ) -> Result<Parked<K, V>, NotParked> {
        if slot.is_none() {
            *slot = Some(self.budget.take().ok_or(NotParked::Full)?);
        }
        let mut g = self.lock();
        if g.epoch != epoch {
            return Err(NotParked::LeaderLost);
        }
        let id = g.next_id;
        g.next_id += 1;
        g.count += 1;
        self.parked.store(g.count, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let key = (namespace::current(), key.clone());
        g.by_key.entry(key.clone()).or_default().push((id, tx));
        Ok(Parked {
            registry: self.clone(),
            key,
            id,
            rx,
        })
    }

    /// Wakes every waiter of `key` in the default namespace with `value`.
    pub fn wake(&self, key: &K, value: &V) {
        self.wake_in(&None, key, value);
    }

    /// Wakes every waiter of `key` in namespace `ns` with `value`.
    pub fn wake_in(&self, ns: &Ns, key: &K, value: &V) {
        if self.is_empty() {
            return;
        }
        let waiters = {
            let mut g = self.lock();
            let w = g
                .by_key
                .remove(&(ns.clone(), key.clone()))
                .unwrap_or_default();
            g.count -= w.len();
            self.parked.store(g.count, Ordering::Relaxed);
            w
        };
        for (_, tx) in waiters {
            let _ = tx.send(Wake::Changed(value.clone()));
        }
    }

    /// Sends `wake()` to every waiter; with `LeaderLost` the epoch moves on as well.
    pub fn wake_all(&self, wake: fn() -> Wake<V>) {
        let waiters = {
            let mut g = self.lock();
            if matches!(wake(), Wake::LeaderLost) {
                g.epoch += 1;
            }
            g.count = 0;
            self.parked.store(0, Ordering::Relaxed);
            std::mem::take(&mut g.by_key)
        };
        for (_, tx) in waiters.into_values().flatten() {
            let _ = tx.send(wake());
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> WaitRegistry<K, V> {
    /// Sends `wake()` to every waiter of namespace `ns` (the leadership epoch stays).
    pub fn wake_namespace(&self, ns: &Ns, wake: fn() -> Wake<V>) {
        if self.is_empty() {
            return;
        }
        let waiters: Vec<_> = {
            let mut g = self.lock();
            let keys: Vec<(Ns, K)> = g.by_key.keys().filter(|(n, _)| n == ns).cloned().collect();
            let w: Vec<_> = keys
                .iter()
                .filter_map(|k| g.by_key.remove(k))
                .flatten()
                .collect();
            g.count -= w.len();
            self.parked.store(g.count, Ordering::Relaxed);
            w
        };
        for (_, tx) in waiters {
            let _ = tx.send(wake());
        }
    }
}

impl<K: Hash + Eq + Clone, V> Parked<K, V> {
    pub async fn wait(&mut self) -> Wake<V> {
        (&mut self.rx).await.unwrap_or(Wake::Recheck)
    }
}

impl<K: Hash + Eq + Clone, V> Drop for Parked<K, V> {
    fn drop(&mut self) {
        let mut g = self
            .registry
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(list) = g.by_key.get_mut(&self.key) {
            let before = list.len();
            list.retain(|(id, _)| *id != self.id);
            let removed = before - list.len();
            if list.is_empty() {
                g.by_key.remove(&self.key);
            }
            g.count -= removed;
            self.registry.parked.store(g.count, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    type Gets = WaitRegistry<String, Bytes>;

    fn gets(max: usize) -> Arc<Gets> {
        Arc::new(Gets::new(ParkBudget::new(max)))
    }

    fn park(
        p: &Arc<Gets>,
        key: &str,
        epoch: u64,
    ) -> Result<(Parked<String, Bytes>, Slot), NotParked> {
        let mut slot = None;
        let parked = p.park(&key.to_string(), epoch, &mut slot)?;
        Ok((parked, slot.expect("a parked call holds a slot")))
    }

    #[tokio::test]
    async fn wakes_waiters_of_the_key_only() {
        let p = gets(0);
        let (mut a, _) = park(&p, "a", 0).expect("park");
        let _b = park(&p, "b", 0).expect("park");
        assert_eq!(p.len(), 2);
        p.wake(&"a".to_string(), &Bytes::from("v"));
        assert!(matches!(a.wait().await, Wake::Changed(v) if v == "v"));
        drop(a);
        assert_eq!(p.len(), 1);
    }

    #[tokio::test]
    async fn leader_loss_fails_waiters_and_refuses_old_epochs() {
        let p = gets(0);
        let epoch = p.epoch();
        let (mut a, _) = park(&p, "a", epoch).expect("park");
        p.wake_all(|| Wake::LeaderLost);
        assert!(matches!(a.wait().await, Wake::LeaderLost));
        assert_eq!(
            park(&p, "a", epoch).err(),
            Some(NotParked::LeaderLost),
            "a stale epoch must not park"
        );
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn cancelled_waiters_unregister() {
        let p = gets(0);
        let a = park(&p, "k", 0).expect("park");
        let b = park(&p, "k", 0).expect("park");
        drop(a);
        assert_eq!(p.len(), 1);
        drop(b);
        assert_eq!(p.len(), 0);
    }

    #[tokio::test]
    async fn the_budget_is_shared_and_a_waiting_call_keeps_its_slot() {
        let budget = ParkBudget::new(2);
        let gets = Arc::new(Gets::new(budget.clone()));
        let others = Arc::new(WaitRegistry::<(), ()>::new(budget.clone()));
        let mut slot = None;
        let mut a = gets.park(&"a".to_string(), 0, &mut slot).expect("first");
        let mut other_slot = None;
        let _o = others.park(&(), 0, &mut other_slot).expect("second");
        let mut refused_slot = None;
        assert_eq!(
            gets.park(&"b".to_string(), 0, &mut refused_slot).err(),
            Some(NotParked::Full)
        );
        assert!(refused_slot.is_none());
        assert_eq!((budget.used(), budget.refused()), (2, 1));
        // Woken, the first call parks again on the slot it holds, though the budget is spent.
        gets.wake(&"a".to_string(), &Bytes::from("v"));
        assert!(matches!(a.wait().await, Wake::Changed(_)));
        drop(a);
        let again = gets.park(&"a".to_string(), 0, &mut slot).expect("re-park");
        drop(again);
        drop(slot);
        assert_eq!(budget.used(), 1);
        let mut freed = None;
        let _b = gets
            .park(&"b".to_string(), 0, &mut freed)
            .expect("room made");
        let err = budget.refusal("GetKeyValue of key \"c\"");
        assert!(
            err.to_string().contains("--max-parked-calls 2") && err.to_string().contains("\"c\""),
            "{err}"
        );
    }
}

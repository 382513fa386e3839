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

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

#[derive(Debug)]
pub enum Wake<V> {
    /// The awaited change happened; it carries what the waiter needs, if anything.
    Changed(V),
    /// The state was replaced wholesale (snapshot install): look again.
    Recheck,
    /// This replica stopped leading.
    LeaderLost,
}

pub struct WaitRegistry<K, V> {
    inner: Mutex<Inner<K, V>>,
    /// Mirror of the number of waiters, so apply skips the lock when nobody waits (the usual
    /// case for keys).
    parked: AtomicUsize,
}

type Waiters<V> = Vec<(u64, oneshot::Sender<Wake<V>>)>;

struct Inner<K, V> {
    by_key: HashMap<K, Waiters<V>>,
    next_id: u64,
    /// Bumped every time leadership is lost; a call that confirmed leadership in an older epoch
    /// may not park.
    epoch: u64,
    count: usize,
}

impl<K, V> Default for WaitRegistry<K, V> {
    fn default() -> Self {
        Self {
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
    key: K,
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

    pub fn len(&self) -> usize {
        self.parked.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Registers a waiter for `key`, unless leadership was lost since `epoch`.
    pub fn park(self: &Arc<Self>, key: &K, epoch: u64) -> Option<Parked<K, V>> {
        let mut g = self.lock();
        if g.epoch != epoch {
            return None;
        }
        let id = g.next_id;
        g.next_id += 1;
        g.count += 1;
        self.parked.store(g.count, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        g.by_key.entry(key.clone()).or_default().push((id, tx));
        Some(Parked {
            registry: self.clone(),
            key: key.clone(),
            id,
            rx,
        })
    }

    /// Wakes every waiter of `key` with `value`.
    pub fn wake(&self, key: &K, value: &V) {
        if self.is_empty() {
            return;
        }
        let waiters = {
            let mut g = self.lock();
            let w = g.by_key.remove(key).unwrap_or_default();
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

    #[tokio::test]
    async fn wakes_waiters_of_the_key_only() {
        let p = Arc::new(Gets::default());
        let mut a = p.park(&"a".to_string(), 0).expect("park");
        let _b = p.park(&"b".to_string(), 0).expect("park");
        assert_eq!(p.len(), 2);
        p.wake(&"a".to_string(), &Bytes::from("v"));
        assert!(matches!(a.wait().await, Wake::Changed(v) if v == "v"));
        drop(a);
        assert_eq!(p.len(), 1);
    }

    #[tokio::test]
    async fn leader_loss_fails_waiters_and_refuses_old_epochs() {
        let p = Arc::new(Gets::default());
        let epoch = p.epoch();
        let mut a = p.park(&"a".to_string(), epoch).expect("park");
        p.wake_all(|| Wake::LeaderLost);
        assert!(matches!(a.wait().await, Wake::LeaderLost));
        assert!(
            p.park(&"a".to_string(), epoch).is_none(),
            "a stale epoch must not park"
        );
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn cancelled_waiters_unregister() {
        let p = Arc::new(Gets::default());
        let a = p.park(&"k".to_string(), 0).expect("park");
        let b = p.park(&"k".to_string(), 0).expect("park");
        drop(a);
        assert_eq!(p.len(), 1);
        drop(b);
        assert_eq!(p.len(), 0);
    }
}

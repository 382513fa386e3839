//! Parked `GetKeyValue` calls: leader-local, woken by apply.
//!
//! A blocking get for a missing key registers here and sleeps. When apply stores the key, the
//! [`ApplyHub`](crate::apply_hub::ApplyHub) hands the value to every waiter of that key. When this
//! replica stops leading, every waiter is failed with `LeaderChanged` so that routing re-drives the
//! call on the new leader (DESIGN: parked RPCs live in leader memory).
//!
//! Registration and the check that the key is missing happen under the state's read lock, and
//! apply wakes waiters only after it released its write lock, so no insert can slip between the
//! check and the registration.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use tokio::sync::oneshot;

#[derive(Debug)]
pub enum Wake {
    /// The key was stored with this value.
    Value(Bytes),
    /// The state was replaced wholesale (snapshot install): look again.
    Recheck,
    /// This replica stopped leading.
    LeaderLost,
}

#[derive(Default)]
pub struct ParkedGets {
    inner: Mutex<Inner>,
    /// Mirror of `Inner::count`, so apply skips the lock when nothing is parked (the usual case).
    parked: AtomicUsize,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<String, Vec<(u64, oneshot::Sender<Wake>)>>,
    next_id: u64,
    /// Bumped every time leadership is lost; a call that confirmed leadership in an older epoch
    /// may not park.
    epoch: u64,
    count: usize,
}

/// A registered waiter; dropping it (the call finished or was cancelled) unregisters it.
pub struct Parked {
    registry: Arc<ParkedGets>,
    key: String,
    id: u64,
    rx: oneshot::Receiver<Wake>,
}

impl ParkedGets {
    fn lock(&self) -> MutexGuard<'_, Inner> {
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
    pub fn park(self: &Arc<Self>, key: &str, epoch: u64) -> Option<Parked> {
        let mut g = self.lock();
        if g.epoch != epoch {
            return None;
        }
        let id = g.next_id;
        g.next_id += 1;
        g.count += 1;
        self.parked.store(g.count, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        g.by_key.entry(key.to_string()).or_default().push((id, tx));
        Some(Parked {
            registry: self.clone(),
            key: key.to_string(),
            id,
            rx,
        })
    }

    /// Hands `value` to every waiter of `key`.
    pub fn wake(&self, key: &str, value: &Bytes) {
        // Registration happens under the state lock before apply's write lock, so a waiter that
        // must see this value is already counted here.
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
            let _ = tx.send(Wake::Value(value.clone()));
        }
    }

    /// Sends `wake()` to every waiter; with `LeaderLost` the epoch moves on as well.
    pub fn wake_all(&self, wake: fn() -> Wake) {
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

impl Parked {
    pub async fn wait(&mut self) -> Wake {
        (&mut self.rx).await.unwrap_or(Wake::Recheck)
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let mut g = self.registry.lock();
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

    #[tokio::test]
    async fn wakes_waiters_of_the_key_only() {
        let p = Arc::new(ParkedGets::default());
        let mut a = p.park("a", 0).expect("park");
        let _b = p.park("b", 0).expect("park");
        assert_eq!(p.len(), 2);
        p.wake("a", &Bytes::from("v"));
        assert!(matches!(a.wait().await, Wake::Value(v) if v == "v"));
        drop(a);
        assert_eq!(p.len(), 1);
    }

    #[tokio::test]
    async fn leader_loss_fails_waiters_and_refuses_old_epochs() {
        let p = Arc::new(ParkedGets::default());
        let epoch = p.epoch();
        let mut a = p.park("a", epoch).expect("park");
        p.wake_all(|| Wake::LeaderLost);
        assert!(matches!(a.wait().await, Wake::LeaderLost));
        assert!(p.park("a", epoch).is_none(), "a stale epoch must not park");
        assert_eq!(p.len(), 0);
    }

    #[test]
    fn cancelled_waiters_unregister() {
        let p = Arc::new(ParkedGets::default());
        let a = p.park("k", 0).expect("park");
        let b = p.park("k", 0).expect("park");
        drop(a);
        assert_eq!(p.len(), 1);
        drop(b);
        assert_eq!(p.len(), 0);
    }
}

//! A follower's callers of one round, waiting on the leader with one call.
//!
//! A follower relays the calls it gets to the leader. For the calls every task of a job makes
//! and every one of them gets the same answer to (jaxlib's GetAliveTasks round, TensorFlow's
//! WaitForAllTasks), relayed call by call each parked on the leader and came back with its own
//! copy of the whole job's answer: N copies of an answer that grows with N. Instead the follower
//! records each call's arrival on the leader at once, as a sidecar records its tasks' arrivals,
//! and the callers of a round share one wait on the leader ([`SharedWaits`]): the answer comes
//! over the follower's link once and every caller is sent that one buffer.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use coord_proto::coord::coordination::BarrierAnswer;
use futures::future::{BoxFuture, Shared, WeakShared};
use futures::FutureExt;
use tonic::metadata::MetadataMap;
use tonic::{Code, Request, Status};

/// The one wait on the leader for a round's answer.
pub type Wait<V> = BoxFuture<'static, Result<V, Status>>;

/// The rounds a follower's callers wait on, by `K`, each waited on with one call to the leader.
/// A round is kept only while a caller waits on it: the last to stop waiting drops it.
pub struct SharedWaits<K, V> {
    waits: Mutex<HashMap<K, WeakShared<Wait<V>>>>,
}

impl<K, V> Default for SharedWaits<K, V> {
    fn default() -> Self {
        Self {
            waits: Mutex::default(),
        }
    }
}

/// Calls waiting on a round here, and waits sent to the leader (`/metrics`).
static WAITING: AtomicUsize = AtomicUsize::new(0);
static WAITS_SENT: AtomicU64 = AtomicU64::new(0);

/// The calls this replica holds while the leader finishes their rounds, and the waits it sent
/// the leader for them: what `/metrics` reports as `coord_relayed_waiting_calls` and
/// `coord_relayed_waits_total`.
pub fn relayed_waits() -> (usize, u64) {
    (
        WAITING.load(Ordering::Relaxed),
        WAITS_SENT.load(Ordering::Relaxed),
    )
}

/// Counts a caller among [`WAITING`] while it lives.
struct Waiting;

impl Waiting {
    fn new() -> Self {
        WAITING.fetch_add(1, Ordering::Relaxed);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<K: Hash + Eq, V: Clone + Send + 'static> SharedWaits<K, V> {
    /// The answer of round `key`, from the wait its callers share; unless there is none, or it
    /// ended in an error (which the caller's routing re-drives: its next try must wait again),
    /// then from the one `wait` makes.
    pub async fn answer(&self, key: K, wait: impl FnOnce() -> Wait<V>) -> Result<V, Status> {
        let shared = self.shared(key, wait);
        let _waiting = Waiting::new();
        shared.await
    }

    fn shared(&self, key: K, wait: impl FnOnce() -> Wait<V>) -> Shared<Wait<V>> {
        let mut waits = self.waits.lock().unwrap_or_else(PoisonError::into_inner);
        let kept = waits.get(&key).and_then(WeakShared::upgrade);
        if let Some(shared) = kept.filter(|s| !matches!(s.peek(), Some(Err(_)))) {
            return shared;
        }
        // Rounds nobody waits on any more go as a new one comes: there are about as many as
        // the rounds waited on at once.
        waits.retain(|_, w| w.upgrade().is_some());
        WAITS_SENT.fetch_add(1, Ordering::Relaxed);
        let shared = wait().shared();
        if let Some(weak) = shared.downgrade() {
            waits.insert(key, weak);
        }
        shared
    }
}

/// `message` under a copy of `metadata` (what a follower's forward of a call carries: its mark,
/// the call's request id and namespace).
pub fn with_metadata<T>(metadata: &MetadataMap, message: T) -> Request<T> {
    let mut req = Request::new(message);
    *req.metadata_mut() = metadata.clone();
    req
}

/// Whether the leader does not know the method a follower called for a round (an older replica,
/// mid-upgrade): the call is then relayed as it came.
pub fn unknown_to_the_leader(s: &Status) -> bool {
    s.code() == Code::Unimplemented && !s.metadata().contains_key(coord_proto::metadata::FINAL)
}

/// The one answer of a call that recorded one arrival: its own error as the task's own call
/// ends with it (marked as the service's answer, as the leader marks it), else the answer.
pub fn recorded(answers: Vec<BarrierAnswer>) -> Result<BarrierAnswer, Status> {
    let [a]: [BarrierAnswer; 1] = answers.try_into().map_err(|a: Vec<_>| {
        Status::internal(format!(
            "the leader answered {} arrivals for the one sent",
            a.len()
        ))
    })?;
    if a.error_code == 0 {
        return Ok(a);
    }
    Err(coord_proto::metadata::final_status(
        a.error_code,
        a.error_message,
        a.error_details,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Callers of one round share its wait; a round that failed is waited on afresh; the last
    /// caller gone, the round goes.
    #[tokio::test]
    async fn callers_of_a_round_share_one_wait() {
        let waits: SharedWaits<u64, u64> = SharedWaits::default();
        let made = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = tokio::sync::oneshot::channel::<u64>();
        let rx = rx
            .map(|r| r.map_err(|_| Status::unavailable("gone")))
            .boxed();
        let first = waits.shared(1, || rx);
        let second = waits.shared(1, || panic!("the round has its wait"));
        tx.send(7).expect("send");
        assert_eq!(first.await.expect("first"), 7);
        assert_eq!(second.await.expect("second"), 7);
        // Nobody waits on round 1 any more: a new wait.
        let counted = made.clone();
        let again = waits.shared(1, move || {
            counted.fetch_add(1, Ordering::Relaxed);
            futures::future::ready(Err(Status::unavailable("leader lost"))).boxed()
        });
        assert!(again.clone().await.is_err());
        // A failed round is waited on again, even while a caller still holds it.
        let retried = waits.shared(1, || futures::future::ready(Ok(8)).boxed());
        assert_eq!(retried.await.expect("retried"), 8);
        drop(again);
        assert_eq!(made.load(Ordering::Relaxed), 1);
    }
}

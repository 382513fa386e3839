//! A follower's callers' asks of one kind, recorded on the leader together.
//!
//! A follower records each relayed jaxlib GetAliveTasks call's ask on the leader before it waits
//! on the round (see `api::relayed_waits`). Every such call lists the tasks it asks about, in a
//! job of 10,000 tasks 10,000 ids (some 65 KB as the leader reads them); recorded call by call,
//! a round through a follower had it encode 10,000 copies of that list and the leader decode
//! them, and the follower spent more CPU on the round than relaying the calls as they came.
//! Instead the asks that arrive while a call recording asks of the same kind is on its way wait
//! for it and then go together in the next, each list sent once, as coord-proxy sends its
//! tasks': [`Batches`] keeps at most one call in flight per kind, so how many asks a call takes
//! follows from how fast they come and how long the leader takes to record them, with no timer.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;
use tonic::Status;

/// The most asks one call records: coord-proxy's largest batch, within the request window each
/// call's numbers must fit (see `coord_proto::metadata::REQUEST_WINDOW`).
pub const MOST_AT_ONCE: usize = 8_192;

/// Asks waiting for the call before theirs, by kind `K`: an entry is there while a sender of
/// that kind runs, and the sender takes it away once it finds none waiting.
pub struct Batches<K, T, A> {
    queues: Queues<K, T, A>,
}

/// An ask and where its answer goes.
type Queued<T, A> = (T, oneshot::Sender<Result<A, Status>>);
/// The asks waiting, by kind.
type Queues<K, T, A> = Arc<Mutex<HashMap<K, Vec<Queued<T, A>>>>>;

impl<K, T, A> Default for Batches<K, T, A> {
    fn default() -> Self {
        Self {
            queues: Arc::default(),
        }
    }
}

/// Callers' asks sent to the leader, and the calls that carried them, of one use of [`Batches`]
/// (`/metrics`).
#[derive(Default)]
pub struct Sent {
    asks: AtomicU64,
    calls: AtomicU64,
}

impl Sent {
    pub const fn new() -> Self {
        Self {
            asks: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }

    /// Counts a call carrying `n` asks.
    pub fn call(&self, n: usize) {
        self.asks.fetch_add(n as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// The asks sent, and the calls that carried them.
    pub fn read(&self) -> (u64, u64) {
        (
            self.asks.load(Ordering::Relaxed),
            self.calls.load(Ordering::Relaxed),
        )
    }
}

/// jaxlib GetAliveTasks asks this replica recorded on the leader for its callers, and the calls
/// that carried them: `coord_relayed_asks_total` and `coord_relayed_ask_calls_total`.
pub static ALIVE_ASKS: Sent = Sent::new();

impl<K, T, A> Batches<K, T, A>
where
    K: Hash + Eq + Clone + Send + 'static,
    T: Send + 'static,
    A: Send + 'static,
{
    /// The answer to `ask`, recorded by a call of `send` with the other asks of kind `key` that
    /// came meanwhile: at once if none of that kind is on its way, else after it. `send` answers
    /// a batch in its order, or fails it whole; the batches run on a task of their own (with the
    /// `send` of the ask that found none on its way), so a caller that goes away abandons only
    /// its own answer (a call all of whose callers went away is dropped).
    pub async fn answer<S, F>(&self, key: K, ask: T, send: S) -> Result<A, Status>
    where
        S: Fn(Vec<T>) -> F + Send + 'static,
        F: Future<Output = Result<Vec<A>, Status>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
            match queues.get_mut(&key) {
                Some(waiting) => {
                    waiting.push((ask, tx));
                    false
                }
                None => {
                    queues.insert(key.clone(), vec![(ask, tx)]);
                    true
                }
            }
        };
        if start {
            tokio::spawn(sent(self.queues.clone(), key, send));
        }
        rx.await.unwrap_or_else(|_| {
            Err(Status::internal(
                "the call recording this ask on the leader ended without an answer",
            ))
        })
    }
}

/// Sends kind `key`'s waiting asks, at most [`MOST_AT_ONCE`] a call, until none wait; a call
/// none of whose callers still waits is given up.
async fn sent<K, T, A, S, F>(queues: Queues<K, T, A>, key: K, send: S)
where
    K: Hash + Eq,
    S: Fn(Vec<T>) -> F,
    F: Future<Output = Result<Vec<A>, Status>>,
{
    let mut sender = Sender {
        queues,
        key: Some(key),
    };
    while let Some(batch) = sender.next() {
        let (asks, mut answers): (Vec<T>, Vec<_>) = batch.into_iter().unzip();
        let n = asks.len();
        // A call whose callers have all gone is dropped (a read parked on the leader for a key
        // nobody waits for any more ends with them).
        let outcome = {
            let abandoned = async {
                for to in &mut answers {
                    to.closed().await;
                }
            };
            tokio::select! {
                got = send(asks) => Some(got),
                () = abandoned => None,
            }
        };
        let Some(outcome) = outcome else {
            continue;
        };
        match outcome {
            Ok(got) if got.len() == n => {
                for (to, a) in answers.into_iter().zip(got) {
                    let _ = to.send(Ok(a));
                }
            }
            outcome => {
                let s = outcome.map_or_else(
                    |s| s,
                    |got| {
                        Status::internal(format!(
                            "the leader answered {} asks for the {n} sent",
                            got.len()
                        ))
                    },
                );
                for to in answers {
                    let _ = to.send(Err(s.clone()));
                }
            }
        }
    }
}

/// A kind's sender, while it runs: its entry, which goes with it however it ends (a sender that
/// ended leaving its entry would leave every later ask of the kind waiting for it).
struct Sender<K: Hash + Eq, T, A> {
    queues: Queues<K, T, A>,
    /// `None` once the entry is gone.
    key: Option<K>,
}

impl<K: Hash + Eq, T, A> Sender<K, T, A> {
    /// The next asks to send, or `None` (the entry gone) when none wait.
    fn next(&mut self) -> Option<Vec<Queued<T, A>>> {
        let key = self.key.as_ref()?;
        let mut queues = self.queues.lock().unwrap_or_else(PoisonError::into_inner);
        let waiting = queues.get_mut(key)?;
        if waiting.is_empty() {
            queues.remove(key);
            drop(queues);
            self.key = None;
            return None;
        }
        let n = waiting.len().min(MOST_AT_ONCE);
        Some(waiting.drain(..n).collect())
    }
}

impl<K: Hash + Eq, T, A> Drop for Sender<K, T, A> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            // The asks waiting go with it: their callers are answered that the call ended.
            self.queues
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Asks that come while a call is on its way go together in the next; each caller gets its
    /// own ask's answer; kinds go apart; a failed call fails each of its asks, and the kind's
    /// asks after it go in a call of their own.
    #[tokio::test]
    async fn asks_coming_meanwhile_go_together_in_the_next_call() {
        let batches: Arc<Batches<&str, u32, u32>> = Arc::default();
        let (release, held) = tokio::sync::watch::channel(false);
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let send = {
            let sizes = sizes.clone();
            move |asks: Vec<u32>| {
                let (sizes, mut held) = (sizes.clone(), held.clone());
                async move {
                    sizes.lock().unwrap().push(asks.len());
                    let _ = held.wait_for(|&go| go).await;
                    if asks.contains(&13) {
                        return Err(Status::unavailable("the leader changed"));
                    }
                    Ok(asks.iter().map(|a| a * 10).collect())
                }
            }
        };
        let ask = |key: &'static str, a: u32| {
            let (batches, send) = (batches.clone(), send.clone());
            tokio::spawn(async move { batches.answer(key, a, send).await })
        };
        let first = ask("set", 1);
        while sizes.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let meanwhile: Vec<_> = (2..=6).map(|a| ask("set", a)).collect();
        let other = ask("other set", 7);
        let waiting = |key| batches.queues.lock().unwrap().get(key).map_or(0, Vec::len);
        while waiting("set") < 5 || sizes.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        release.send(true).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), 10);
        for (a, call) in (2..=6).zip(meanwhile) {
            assert_eq!(call.await.unwrap().unwrap(), a * 10);
        }
        assert_eq!(other.await.unwrap().unwrap(), 70);
        let mut seen = sizes.lock().unwrap().clone();
        seen.sort_unstable();
        assert_eq!(seen, [1, 1, 5], "one call each for 1 and 7, one for 2..=6");
        // The senders go once they find nothing waiting, each after answering its last call.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !batches.queues.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "a sender stayed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }

        let failed = ask("set", 13).await.unwrap();
        assert_eq!(failed.unwrap_err().code(), tonic::Code::Unavailable);
        assert_eq!(ask("set", 4).await.unwrap().unwrap(), 40);
    }

    /// A batch is at most [`MOST_AT_ONCE`] asks; the rest go in the next call.
    #[tokio::test]
    async fn a_call_takes_at_most_most_at_once() {
        let batches: Arc<Batches<u8, usize, usize>> = Arc::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let send = {
            let calls = calls.clone();
            move |asks: Vec<usize>| {
                calls.fetch_add(1, Ordering::SeqCst);
                assert!(asks.len() <= MOST_AT_ONCE, "{} asks in a call", asks.len());
                std::future::ready(Ok(asks))
            }
        };
        let all: Vec<_> = (0..MOST_AT_ONCE + 2)
            .map(|a| {
                let (batches, send) = (batches.clone(), send.clone());
                tokio::spawn(async move { batches.answer(0, a, send).await })
            })
            .collect();
        for (a, call) in all.into_iter().enumerate() {
            assert_eq!(call.await.unwrap().unwrap(), a);
        }
        assert!(calls.load(Ordering::SeqCst) >= 2);
    }
}

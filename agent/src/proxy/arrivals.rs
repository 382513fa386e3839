//! Calls that park until other tasks arrive (barriers, WaitForAllTasks), from the tasks a sidecar
//! carries: their arrivals recorded together, and one wait per instance for all of them.
//!
//! A task's call parks on the leader until every participant has arrived. With one parked call
//! per task, a barrier of 100,000 tasks is released as 100,000 answers the leader sends at once:
//! seconds on two cores; and WaitForAllTasks sends every task the whole job's devices. So the
//! proxy records its tasks' arrivals without parking them (a call that answers at once: an
//! arrival whose instance is decided gets its outcome, the others are pending) and waits on each
//! instance its tasks are pending at with one call, whose answer it hands to each of them. Each
//! task gets the answer its own call would have had; the leader answers one call per sidecar.
//!
//! Arrivals are not held for a window: one that finds no call on its way goes at once, and those
//! that come while one is on its way go together when it returns, so batches grow only with the
//! load. An ensemble without the calls (an older release) answers UNIMPLEMENTED: the proxy then
//! sends every task's call on its own, as before.
//!
//! What differs between the calls (how arrivals are recorded, what an instance is, how it is
//! waited on) is a [`Gathered`] kind, in [`super::barriers`].

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use coord_proto::coord::coordination::BarrierAnswer;
use tokio::sync::oneshot;
use tonic::{Code, Status};

use crate::client::CoordClient;

/// Most arrivals in one call; more go in the next. Under the replicas' own limit
/// (`coordination::MAX_ARRIVALS`).
const MAX_BATCH: usize = 8_192;

/// Most bytes of arrivals in one call (one larger arrival goes alone): under the 4 MiB an older
/// replica decodes, whatever devices or task lists the arrivals carry.
const MAX_BATCH_BYTES: usize = 2 << 20;

/// A future the kinds hand back, boxed.
pub type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A kind of call whose arrivals are recorded together.
pub trait Gathered: Send + Sync + 'static {
    /// A task's own request (or what the proxy reads it into).
    type Req: Clone + Send + Sync + 'static;
    /// What its own call answers.
    type Answer: Clone + Send + 'static;
    /// What one shared answer is for: the instance waited on (and the form of its answer).
    type Key: Hash + Eq + Clone + Send + Sync + 'static;

    /// What `arrival` adds to a call: its own bytes, and a part it may share with the call's
    /// other arrivals, counted once a call (an identity, and its bytes).
    fn size(arrival: &Self::Req) -> Size;

    /// Records `arrivals` in one call: one answer per arrival, in order.
    fn record(
        client: CoordClient,
        arrivals: Vec<Self::Req>,
    ) -> Boxed<Result<Vec<BarrierAnswer>, Status>>;

    /// The arrival's answer if the ensemble decided it, else what it waits on.
    fn decided(
        arrival: &Self::Req,
        answer: BarrierAnswer,
    ) -> Result<Result<Self::Answer, Status>, Self::Key>;

    /// Waits on `key`, which `arrival` waits on: the answer of every task waiting there.
    fn wait(
        client: CoordClient,
        key: Self::Key,
        arrival: Self::Req,
    ) -> Boxed<Result<Self::Answer, Status>>;

    /// One task's call forwarded on its own.
    fn alone(client: CoordClient, arrival: Self::Req) -> Boxed<Result<Self::Answer, Status>>;
}

/// What an arrival adds to a call (see [`Gathered::size`]).
pub type Size = (usize, Option<(usize, usize)>);

/// The size of an arrival that is a message of its own, sharing nothing.
pub fn own_size<M: prost::Message>(m: &M) -> Size {
    (m.encoded_len(), None)
}

type Reply<G> = oneshot::Sender<Result<<G as Gathered>::Answer, Status>>;

struct State<G: Gathered> {
    /// Arrivals not yet sent.
    queued: Vec<(G::Req, Reply<G>)>,
    /// A call recording arrivals is on its way: the queued ones go when it returns.
    sending: bool,
    /// The tasks waiting on each key, answered together by one wait.
    waits: HashMap<G::Key, Vec<Reply<G>>>,
}

struct Shared<G: Gathered> {
    state: Mutex<State<G>>,
    /// The ensemble does not know the calls: every arrival goes on its own.
    unbatched: AtomicBool,
    /// Calls sent to the ensemble: arrivals recorded together, waits, and arrivals sent alone.
    calls: AtomicU64,
    /// Arrivals recorded and waiting for their instance's outcome.
    waiting: AtomicU64,
    /// Waits sent (each answering every task waiting on its key).
    waits: AtomicU64,
    /// When the last wait's answer came from the ensemble (before its tasks were answered).
    outcome_at: Mutex<Option<Instant>>,
}

impl<G: Gathered> Shared<G> {
    fn state(&self) -> std::sync::MutexGuard<'_, State<G>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The arrivals of one kind of call a proxy records together (see the module doc).
pub struct Gatherer<G: Gathered> {
    together: bool,
    shared: Arc<Shared<G>>,
}

impl<G: Gathered> Gatherer<G> {
    /// Arrivals recorded together and waited on per instance; `together` false sends each task's
    /// call on its own.
    pub fn new(together: bool) -> Self {
        Self {
            together,
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    queued: Vec::new(),
                    sending: false,
                    waits: HashMap::new(),
                }),
                unbatched: AtomicBool::new(false),
                calls: AtomicU64::new(0),
                waiting: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                outcome_at: Mutex::new(None),
            }),
        }
    }

    /// Calls sent to the ensemble so far.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Waits sent to the ensemble so far, each answering every task waiting on its key.
    pub fn waits(&self) -> u64 {
        self.shared.waits.load(Ordering::Relaxed)
    }

    /// Arrivals recorded on the ensemble and waiting for their instance's outcome.
    pub fn waiting(&self) -> u64 {
        self.shared.waiting.load(Ordering::Relaxed)
    }

    /// When a wait's answer last came from the ensemble, before its tasks were answered: what a
    /// release takes on the ensemble's side.
    pub fn outcome_at(&self) -> Option<Instant> {
        *self
            .shared
            .outcome_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `req`'s arrival through `client` with the other tasks' and answers it, once its
    /// instance is decided, as its own call would have been answered.
    pub async fn send(&self, client: &CoordClient, req: G::Req) -> Result<G::Answer, Status> {
        if !self.together || self.shared.unbatched.load(Ordering::Relaxed) {
            self.shared.calls.fetch_add(1, Ordering::Relaxed);
            return G::alone(client.clone(), req).await;
        }
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut state = self.shared.state();
            state.queued.push((req, tx));
            !std::mem::replace(&mut state.sending, true)
        };
        if start {
            let (shared, client) = (self.shared.clone(), client.clone());
            tokio::spawn(async move { send_queued(&shared, &client).await });
        }
        rx.await.map_err(|_| {
            Status::unavailable("the proxy stopped before the task's arrival was answered")
        })?
    }
}

/// Sends the queued arrivals, a call at a time, until none is left.
async fn send_queued<G: Gathered>(shared: &Arc<Shared<G>>, client: &CoordClient) {
    loop {
        let batch = {
            let mut state = shared.state();
            if state.queued.is_empty() {
                state.sending = false;
                return;
            }
            let n = batch_len(&state.queued, G::size);
            state.queued.drain(..n).collect::<Vec<_>>()
        };
        shared.calls.fetch_add(1, Ordering::Relaxed);
        record(shared, client, batch).await;
    }
}

/// How many of the `queued` arrivals the next call carries: at least one, at most [`MAX_BATCH`]
/// and [`MAX_BATCH_BYTES`] (a part arrivals share counted once).
fn batch_len<R, T>(queued: &[(R, T)], size: impl Fn(&R) -> Size) -> usize {
    let mut bytes = 0;
    let mut shared: Vec<usize> = Vec::new();
    let fit = queued
        .iter()
        .take(MAX_BATCH)
        .take_while(|(req, _)| {
            let (own, part) = size(req);
            bytes += own;
            if let Some((id, part_bytes)) = part {
                if !shared.contains(&id) {
                    shared.push(id);
                    bytes += part_bytes;
                }
            }
            bytes <= MAX_BATCH_BYTES
        })
        .count();
    fit.max(1).min(queued.len())
}

/// Records `batch` in one call; answers each decided arrival and puts each other one with those
/// waiting on the same key.
async fn record<G: Gathered>(
    shared: &Arc<Shared<G>>,
    client: &CoordClient,
    batch: Vec<(G::Req, Reply<G>)>,
) {
    let (arrivals, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
    match G::record(client.clone(), arrivals.clone()).await {
        Ok(answers) if answers.len() == replies.len() => {
            for ((arrival, reply), answer) in arrivals.into_iter().zip(replies).zip(answers) {
                match G::decided(&arrival, answer) {
                    Ok(answer) => {
                        let _ = reply.send(answer);
                    }
                    Err(key) => wait_on(shared, client, key, arrival, reply),
                }
            }
        }
        Ok(answers) => {
            let wrong = Status::internal(format!(
                "the ensemble answered {} of {} arrivals sent together",
                answers.len(),
                replies.len()
            ));
            for reply in replies {
                let _ = reply.send(Err(wrong.clone()));
            }
        }
        Err(s) if s.code() == Code::Unimplemented => {
            shared.unbatched.store(true, Ordering::Relaxed);
            for (arrival, reply) in arrivals.into_iter().zip(replies) {
                shared.calls.fetch_add(1, Ordering::Relaxed);
                let alone = G::alone(client.clone(), arrival);
                tokio::spawn(async move {
                    let _ = reply.send(alone.await);
                });
            }
        }
        Err(s) => {
            for reply in replies {
                let _ = reply.send(Err(s.clone()));
            }
        }
    }
}

/// Puts `reply` with the tasks waiting on `key`; the first starts the wait, for its `arrival`.
fn wait_on<G: Gathered>(
    shared: &Arc<Shared<G>>,
    client: &CoordClient,
    key: G::Key,
    arrival: G::Req,
    reply: Reply<G>,
) {
    let first = {
        let mut state = shared.state();
        let waiting = state.waits.entry(key.clone()).or_default();
        waiting.push(reply);
        waiting.len() == 1
    };
    shared.waiting.fetch_add(1, Ordering::Relaxed);
    if !first {
        return;
    }
    shared.calls.fetch_add(1, Ordering::Relaxed);
    shared.waits.fetch_add(1, Ordering::Relaxed);
    let shared = shared.clone();
    let wait = G::wait(client.clone(), key.clone(), arrival);
    tokio::spawn(async move {
        let outcome = wait.await;
        *shared
            .outcome_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        // Taken only now: a task found waiting meanwhile is answered with the others.
        let replies = shared.state().waits.remove(&key).unwrap_or_default();
        shared
            .waiting
            .fetch_sub(replies.len() as u64, Ordering::Relaxed);
        for reply in replies {
            let _ = reply.send(outcome.clone());
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_proto::tensorflow::BarrierRequest;

    fn queued(n: usize, id_bytes: usize) -> Vec<(BarrierRequest, ())> {
        let req = BarrierRequest {
            barrier_id: "b".repeat(id_bytes),
            ..Default::default()
        };
        vec![(req, ()); n]
    }

    #[test]
    fn a_batch_is_capped_by_count_and_by_bytes() {
        let len = |q: &[(BarrierRequest, ())]| batch_len(q, own_size);
        assert_eq!(len(&queued(3, 10)), 3);
        assert_eq!(len(&queued(MAX_BATCH + 5, 10)), MAX_BATCH);
        // 1 MiB arrivals: two fit in one call.
        assert_eq!(len(&queued(5, 1 << 20)), 1);
        assert_eq!(len(&queued(5, (1 << 20) - 16)), 2);
        // One arrival over the cap still goes, alone.
        assert_eq!(len(&queued(2, 3 << 20)), 1);
        assert_eq!(len(&[]), 0);
    }

    /// Arrivals sharing a part (the set GetAliveTasks asks about) count it once a call.
    #[test]
    fn a_shared_part_is_counted_once() {
        let part = 768 << 10;
        let q: Vec<((usize, usize), ())> = [0, 1, 0, 2].map(|id| ((id, part), ())).to_vec();
        let len = |q: &[((usize, usize), ())]| batch_len(q, |&(id, bytes)| (10, Some((id, bytes))));
        // Parts 0 and 1 fit (1.5 MiB); the third arrival shares part 0; part 2 would pass 2 MiB.
        assert_eq!(len(&q), 3);
        let one: Vec<_> = (0..100).map(|_| ((7, 1 << 20), ())).collect();
        assert_eq!(len(&one), 100);
    }
}

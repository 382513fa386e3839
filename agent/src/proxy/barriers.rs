//! TensorFlow barrier arrivals of the tasks a sidecar carries: recorded together, and one wait per
//! barrier instance for all of them.
//!
//! A task's Barrier call parks on the leader until every participant has arrived. With one parked
//! call per task, a barrier of 100,000 tasks is released as 100,000 answers the leader sends at
//! once: seconds on two cores. So the proxy records its tasks' arrivals without parking them
//! (`coord.coordination.Coordination/BarrierArrivals`, which answers at once: an arrival whose
//! instance is decided gets its outcome, the others are pending) and waits on each instance its
//! tasks are pending at with one call (`AwaitBarrier`), whose answer it hands to each of them. Each
//! task gets the answer its own call would have had, TensorFlow's `BarrierError` included; the
//! leader's release answers one call per sidecar.
//!
//! Arrivals are not held for a window: one that finds no call on its way goes at once, and those
//! that come while one is on its way go together when it returns, so batches grow only with the
//! load. An ensemble without the calls (an older release) answers UNIMPLEMENTED: the proxy then
//! sends every task's Barrier call on its own, as before.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use coord_proto::coord::coordination::coordination_client::CoordinationClient;
use coord_proto::coord::coordination::{
    AwaitBarrierRequest, BarrierAnswer, BarrierArrivalsRequest,
};
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use tokio::sync::oneshot;
use tonic::{Code, Status};

use super::final_status;
use crate::client::CoordClient;

/// Most arrivals in one call; more go in the next. Under the replicas' own limit
/// (`coordination::MAX_ARRIVALS`).
const MAX_BATCH: usize = 8_192;

/// What a task's Barrier call is answered with: the instance's counter, or its error.
type Reply = oneshot::Sender<Result<i64, Status>>;

/// A barrier instance: its id and counter.
type Instance = (String, i64);

#[derive(Default)]
struct State {
    /// Arrivals not yet sent.
    queued: Vec<(tf::BarrierRequest, Reply)>,
    /// A call recording arrivals is on its way: the queued ones go when it returns.
    sending: bool,
    /// The tasks pending at each instance, answered together by one AwaitBarrier.
    waits: HashMap<Instance, Vec<Reply>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// The ensemble does not know the calls: every arrival goes on its own.
    unbatched: AtomicBool,
    /// Calls sent to the ensemble: arrivals recorded together, waits, and arrivals sent alone.
    calls: AtomicU64,
    /// Arrivals recorded and waiting for their instance's outcome.
    waiting: AtomicU64,
    /// When the last instance's outcome came from the ensemble (before its tasks were answered).
    outcome_at: Mutex<Option<Instant>>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The barrier arrivals a proxy records together (see the module doc).
pub struct BarrierBatches {
    together: bool,
    shared: Arc<Shared>,
}

impl BarrierBatches {
    /// Arrivals recorded together and waited on per instance; `together` false sends each task's
    /// Barrier call on its own.
    pub fn new(together: bool) -> Self {
        Self {
            together,
            shared: Arc::default(),
        }
    }

    /// Calls sent to the ensemble so far.
    pub fn calls(&self) -> u64 {
        self.shared.calls.load(Ordering::Relaxed)
    }

    /// Arrivals recorded on the ensemble and waiting for their instance's outcome.
    pub fn waiting(&self) -> u64 {
        self.shared.waiting.load(Ordering::Relaxed)
    }

    /// When the outcome of an instance its tasks were pending at last came from the ensemble,
    /// before they were answered: what a barrier's release takes on the ensemble's side.
    pub fn outcome_at(&self) -> Option<Instant> {
        *self
            .shared
            .outcome_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `req`'s arrival through `client` with the other tasks' and answers it, once its
    /// instance is decided, as its own call would have been answered.
    pub async fn barrier(
        &self,
        client: &CoordClient,
        req: tf::BarrierRequest,
    ) -> Result<tf::BarrierResponse, Status> {
        if !self.together || self.shared.unbatched.load(Ordering::Relaxed) {
            self.shared.calls.fetch_add(1, Ordering::Relaxed);
            return alone(client, req).await;
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
        let counter = rx.await.map_err(|_| {
            Status::unavailable("the proxy stopped before the barrier arrival was answered")
        })??;
        Ok(tf::BarrierResponse { counter })
    }
}

/// One task's Barrier call forwarded on its own.
async fn alone(
    client: &CoordClient,
    req: tf::BarrierRequest,
) -> Result<tf::BarrierResponse, Status> {
    client
        .forward(req, true, true, |ch, r| async move {
            CoordinationServiceClient::new(ch).barrier(r).await
        })
        .await
}

/// Sends the queued arrivals, a call at a time, until none is left.
async fn send_queued(shared: &Arc<Shared>, client: &CoordClient) {
    loop {
        let batch = {
            let mut state = shared.state();
            if state.queued.is_empty() {
                state.sending = false;
                return;
            }
            let n = state.queued.len().min(MAX_BATCH);
            state.queued.drain(..n).collect::<Vec<_>>()
        };
        shared.calls.fetch_add(1, Ordering::Relaxed);
        record(shared, client, batch).await;
    }
}

/// Records `batch` in one call; answers each decided arrival and puts each pending one with the
/// others waiting on its instance.
async fn record(
    shared: &Arc<Shared>,
    client: &CoordClient,
    batch: Vec<(tf::BarrierRequest, Reply)>,
) {
    let (arrivals, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
    let req = BarrierArrivalsRequest {
        arrivals: arrivals.clone(),
    };
    let sent = client
        .forward(req, true, false, |ch, r| async move {
            CoordinationClient::new(ch).barrier_arrivals(r).await
        })
        .await;
    match sent {
        Ok(resp) if resp.answers.len() == replies.len() => {
            for ((arrival, reply), answer) in arrivals.into_iter().zip(replies).zip(resp.answers) {
                if answer.pending {
                    wait_on(shared, client, (arrival.barrier_id, answer.counter), reply);
                } else {
                    let _ = reply.send(answered(answer));
                }
            }
        }
        Ok(resp) => {
            let wrong = Status::internal(format!(
                "the ensemble answered {} of {} barrier arrivals sent together",
                resp.answers.len(),
                replies.len()
            ));
            for reply in replies {
                let _ = reply.send(Err(wrong.clone()));
            }
        }
        Err(s) if s.code() == Code::Unimplemented => {
            shared.unbatched.store(true, Ordering::Relaxed);
            for (arrival, reply) in arrivals.into_iter().zip(replies) {
                let client = client.clone();
                shared.calls.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let _ = reply.send(alone(&client, arrival).await.map(|r| r.counter));
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

/// Puts `reply` with the tasks pending at `instance`; the first starts the instance's wait.
fn wait_on(shared: &Arc<Shared>, client: &CoordClient, instance: Instance, reply: Reply) {
    let first = {
        let mut state = shared.state();
        let pending = state.waits.entry(instance.clone()).or_default();
        pending.push(reply);
        pending.len() == 1
    };
    shared.waiting.fetch_add(1, Ordering::Relaxed);
    if !first {
        return;
    }
    shared.calls.fetch_add(1, Ordering::Relaxed);
    let (shared, client) = (shared.clone(), client.clone());
    tokio::spawn(async move {
        let req = AwaitBarrierRequest {
            barrier_id: instance.0.clone(),
            counter: instance.1,
        };
        let outcome = client
            .forward(req, false, true, |ch, r| async move {
                CoordinationClient::new(ch).await_barrier(r).await
            })
            .await
            .and_then(answered);
        *shared
            .outcome_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        // Taken only now: a task found pending meanwhile is answered with the others.
        let replies = shared.state().waits.remove(&instance).unwrap_or_default();
        shared
            .waiting
            .fetch_sub(replies.len() as u64, Ordering::Relaxed);
        for reply in replies {
            let _ = reply.send(outcome.clone());
        }
    });
}

/// A decided arrival's answer as its own call's.
fn answered(a: BarrierAnswer) -> Result<i64, Status> {
    if a.error_code == 0 {
        return Ok(a.counter);
    }
    Err(final_status(a.error_code, a.error_message, a.error_details))
}

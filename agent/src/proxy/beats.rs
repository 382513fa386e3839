//! TensorFlow heartbeats of the tasks a sidecar carries, sent to the ensemble together.
//!
//! TensorFlow's agents heartbeat every 5 s (half their heartbeat timeout): a job of 100,000 tasks
//! sends the leader 20,000 calls a second, and each call's HTTP/2 stream, headers and trailers cost
//! the leader more than the heartbeat itself. So the proxy holds each heartbeat up to a window
//! (`--heartbeat-batch-ms`) and sends every heartbeat held then as one
//! `coord.coordination.Coordination/Heartbeats` call; each task gets the answer its own call would
//! have had (its error, with TensorFlow's payloads, included), later by at most the window.
//!
//! A heartbeat that finds no batch open opens one, so a sidecar of k tasks whose agents beat every
//! interval sends about 1 + k × window / interval heartbeats a call (tasks answered together do
//! not merge with the others: each keeps its own period). The window must stay well under the
//! agents' interval, which is also their heartbeat call's deadline; the leader hears each
//! heartbeat later by up to the window, which the heartbeat timeout (twice the interval) leaves
//! room for.
//!
//! An ensemble without the call (an older release) answers UNIMPLEMENTED: the proxy then sends
//! every heartbeat on its own, as before.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use coord_proto::coord::coordination::coordination_client::CoordinationClient;
use coord_proto::coord::coordination::{Beat, BeatAnswer, HeartbeatsRequest};
use coord_proto::metadata::final_status;
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use tokio::sync::oneshot;
use tonic::{Code, Status};

use crate::client::CoordClient;

/// How long the proxy holds a heartbeat by default: a small part of TensorFlow's 5 s interval.
pub const DEFAULT_WINDOW: Duration = Duration::from_millis(200);

/// Most heartbeats in one call; a batch this full is sent at once. Under the replicas' own limit
/// (`coordination::MAX_BEATS`).
const MAX_BATCH: usize = 8_192;

/// What a held heartbeat is answered with: the service incarnation, or the task's error.
type Answer = Result<u64, Status>;

/// Heartbeats gathered for the next call.
#[derive(Default)]
struct Batch {
    beats: Vec<Beat>,
    waiting: Vec<oneshot::Sender<Answer>>,
}

/// The heartbeats a proxy holds and sends together (see the module doc).
pub struct HeartbeatBatches {
    window: Duration,
    /// The batch gathering now, if one is: its call goes when its window ends.
    open: Arc<Mutex<Option<Batch>>>,
    /// The ensemble does not know the call: every heartbeat goes on its own.
    unbatched: Arc<AtomicBool>,
    /// Calls sent to the ensemble, batches and heartbeats sent alone alike.
    calls: Arc<AtomicU64>,
}

impl HeartbeatBatches {
    /// Heartbeats held up to `window`; a zero window sends each on its own, at once.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            open: Arc::default(),
            unbatched: Arc::default(),
            calls: Arc::default(),
        }
    }

    /// Calls sent to the ensemble so far (a batch counts once).
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Sends `req` to the ensemble through `client`, with the heartbeats of other tasks held
    /// meanwhile, and answers it as its own call would have been answered.
    pub async fn heartbeat(
        &self,
        client: &CoordClient,
        req: tf::HeartbeatRequest,
    ) -> Result<tf::HeartbeatResponse, Status> {
        if self.window.is_zero() || self.unbatched.load(Ordering::Relaxed) {
            self.calls.fetch_add(1, Ordering::Relaxed);
            return alone(client, req).await;
        }
        let (tx, rx) = oneshot::channel();
        let full = {
            let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
            let batch = match open.as_mut() {
                Some(b) => b,
                None => {
                    self.send_after(client, self.window);
                    open.insert(Batch::default())
                }
            };
            batch.beats.push(Beat {
                task: req.source_task,
                incarnation: req.incarnation,
            });
            batch.waiting.push(tx);
            batch.beats.len() >= MAX_BATCH
        };
        if full {
            self.send_after(client, Duration::ZERO);
        }
        let leader_incarnation = rx.await.map_err(|_| {
            Status::unavailable("the proxy stopped before the heartbeat was sent")
        })??;
        Ok(tf::HeartbeatResponse { leader_incarnation })
    }

    /// Sends whatever batch is open after `wait`. (A batch sent full before its window ended
    /// leaves its timer to send the next one early: harmless.)
    fn send_after(&self, client: &CoordClient, wait: Duration) {
        let (open, unbatched, calls) = (
            self.open.clone(),
            self.unbatched.clone(),
            self.calls.clone(),
        );
        let client = client.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let batch = open.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(batch) = batch {
                calls.fetch_add(1, Ordering::Relaxed);
                send(&client, batch, &unbatched).await;
            }
        });
    }
}

/// One heartbeat forwarded on its own.
async fn alone(
    client: &CoordClient,
    req: tf::HeartbeatRequest,
) -> Result<tf::HeartbeatResponse, Status> {
    client
        .forward(req, false, false, |ch, r| async move {
            CoordinationServiceClient::new(ch).heartbeat(r).await
        })
        .await
}

/// Sends `batch` as one call and hands each heartbeat its answer.
async fn send(client: &CoordClient, batch: Batch, unbatched: &AtomicBool) {
    let Batch { beats, waiting } = batch;
    let req = HeartbeatsRequest {
        beats: beats.clone(),
    };
    let sent = client
        .forward(req, false, false, |ch, r| async move {
            CoordinationClient::new(ch).heartbeats(r).await
        })
        .await;
    match sent {
        Ok(resp) if resp.answers.len() == waiting.len() => {
            for (answer, tx) in resp.answers.into_iter().zip(waiting) {
                let _ = tx.send(answered(answer));
            }
        }
        Ok(resp) => {
            let wrong = Status::internal(format!(
                "the ensemble answered {} of {} heartbeats sent together",
                resp.answers.len(),
                waiting.len()
            ));
            for tx in waiting {
                let _ = tx.send(Err(wrong.clone()));
            }
        }
        Err(s) if s.code() == Code::Unimplemented => {
            unbatched.store(true, Ordering::Relaxed);
            for (beat, tx) in beats.into_iter().zip(waiting) {
                let client = client.clone();
                tokio::spawn(async move {
                    let req = tf::HeartbeatRequest {
                        incarnation: beat.incarnation,
                        source_task: beat.task,
                    };
                    let _ = tx.send(alone(&client, req).await.map(|r| r.leader_incarnation));
                });
            }
        }
        Err(s) => {
            for tx in waiting {
                let _ = tx.send(Err(s.clone()));
            }
        }
    }
}

/// A beat's answer as its own call's.
fn answered(a: BeatAnswer) -> Answer {
    if a.error_code == 0 {
        return Ok(a.leader_incarnation);
    }
    Err(final_status(a.error_code, a.error_message, a.error_details))
}

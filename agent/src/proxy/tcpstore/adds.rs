//! ADDs of many torch connections, sent to the ensemble together.
//!
//! `init_process_group` has every rank ADD itself to one counter at once. As a gRPC call each, a
//! job of 100,000 ranks behind 8 sidecars put 12,500 calls on each sidecar's connection to the
//! leader at once: the leader fell behind so far that it left the connections' HTTP/2 pings
//! unanswered for seconds, the sidecars dropped the connections, and every ADD on them failed.
//! Here the ADDs waiting when a flight leaves go in one `RawKeys.Adds`, and those that arrive
//! while it is out go in the next, so flights grow only with the load (one connection alone sees
//! one call per ADD, as before). Each ADD is applied once, under a request number of its own, and
//! answered as its own call would be: its value, or its own error.
//!
//! An ensemble without `Adds` (an older release) answers UNIMPLEMENTED: from then on every ADD
//! goes on its own. A flight that fails as a whole is sent again one ADD per call, each under the
//! request number it had in the flight: one connection's bad request does not fail its
//! neighbours', and a flight applied before its call broke is not applied again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use coord_proto::coord::kv as pb;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use super::reads::raw;
use crate::client::CoordClient;

/// At most this many ADDs in one flight (the ensemble takes 8,192 a call).
const MAX_FLIGHT_ADDS: usize = 4096;

/// At most this many bytes of keys in one flight (one larger ADD goes alone): under the 4 MiB a
/// replica decodes.
const MAX_FLIGHT_BYTES: usize = 2 << 20;

type Added = Result<i64, Status>;

struct Add {
    req: pb::RawAddRequest,
    reply: oneshot::Sender<Added>,
}

/// The flights of one proxy's ADDs (cloned into every connection's [`super::Store`]).
#[derive(Clone)]
pub struct Adds {
    tx: mpsc::UnboundedSender<Add>,
    client: CoordClient,
    /// Cleared when the ensemble does not know `Adds`.
    batched: Arc<AtomicBool>,
}

impl Adds {
    /// Starts the task that sends the flights; it ends when every `Adds` is dropped.
    pub fn start(client: CoordClient) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let batched = Arc::new(AtomicBool::new(true));
        tokio::spawn(flights(client.clone(), batched.clone(), rx));
        Self {
            tx,
            client,
            batched,
        }
    }

    /// Adds `delta` to the counter at `key` (already prefixed): its new value.
    pub async fn add(&self, key: Bytes, delta: i64) -> Added {
        let req = pb::RawAddRequest { key, delta };
        if !self.batched.load(Ordering::Relaxed) {
            // Boxed, as `ops::call!` is: every connection's task keeps room for what its ADD
            // awaits, and this fallback's gRPC call is 4.5 KB of it.
            return Box::pin(alone(&self.client, req)).await;
        }
        let (reply, answer) = oneshot::channel();
        let gone = || Status::unavailable("coord-proxy's adds task has stopped");
        self.tx.send(Add { req, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn flights(
    client: CoordClient,
    batched: Arc<AtomicBool>,
    mut rx: mpsc::UnboundedReceiver<Add>,
) {
    while let Some(first) = rx.recv().await {
        let mut bytes = first.req.key.len();
        let mut flight = vec![first];
        while flight.len() < MAX_FLIGHT_ADDS {
            let Ok(next) = rx.try_recv() else { break };
            bytes += next.req.key.len();
            flight.push(next);
            if bytes >= MAX_FLIGHT_BYTES {
                break;
            }
        }
        let n = flight.len();
        let (reqs, replies): (Vec<_>, Vec<_>) =
            flight.into_iter().map(|a| (a.req, a.reply)).unzip();
        match client.raw_adds(reqs).await {
            Ok(answers) if answers.len() == n => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(answered(answer));
                }
            }
            Ok(answers) => {
                let s = Status::internal(format!(
                    "the ensemble answered {} adds of {n}",
                    answers.len()
                ));
                for reply in replies {
                    let _ = reply.send(Err(s.clone()));
                }
            }
            Err(failed) => {
                let code = failed.status.code();
                if code == Code::Unimplemented {
                    batched.store(false, Ordering::Relaxed);
                }
                // No replica could serve it: the same for every ADD of the flight. Otherwise each
                // is sent alone under the number it had in the flight, so that one connection's
                // bad request does not fail its neighbours' and an ADD the ensemble applied
                // before the call broke is answered with its value, not applied again.
                let answers =
                    if (n == 1 && code != Code::Unimplemented) || code == Code::Unavailable {
                        vec![Err(failed.status); n]
                    } else {
                        failed.each_alone(&client).await
                    };
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(answer);
                }
            }
        }
    }
}

/// One add's answer among a flight's: its value, or the error its own call would have had.
fn answered(a: pb::RawAddAnswer) -> Added {
    match a.error_code {
        0 => Ok(a.value),
        code => Err(Status::new(Code::from(code), a.error_message)),
    }
}

/// One `RawKeys.Add`, under a request id of the proxy's own.
async fn alone(client: &CoordClient, req: pb::RawAddRequest) -> Added {
    let resp = client
        .forward(
            req,
            true,
            false,
            |ch, r| async move { raw(ch).add(r).await },
        )
        .await?;
    Ok(resp.value)
}

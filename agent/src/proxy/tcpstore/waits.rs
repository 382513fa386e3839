//! WAITs of many torch connections for the same keys, parked on the leader as one call.
//!
//! In `init_process_group` every rank WAITs for the same key: thousands of parked calls on the
//! leader, each a gRPC stream, all woken by one write (in a 4096-rank burst the wake-up took a
//! quarter of coord's time). Here the first WAIT for a set of keys parks one call, and later WAITs
//! for the same keys join it. Those who were there when it was sent are released by its answer.
//! Those who joined later could have arrived after that answer was decided (and after a delete
//! undid it), so they are released only by a CHECK sent after all of them arrived, one call for
//! all; if the keys are gone by then they park together again. So every release still rests on a
//! state the ensemble reached after that WAIT arrived, as a WAIT of its own would.
//!
//! A waiter that goes away (CANCEL_WAIT, a closed connection) drops its place; when no waiter is
//! left the parked call is dropped, which cancels it on the leader.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use coord_proto::coord::kv as pb;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::reads::raw;
use crate::client::CoordClient;

type Released = oneshot::Sender<Result<(), Status>>;

/// How often a parked call looks for waiters that went away.
const PRUNE_EVERY: Duration = Duration::from_millis(200);

/// The proxy's parked WAITs, one per set of keys (cloned into every connection's store).
#[derive(Clone)]
pub struct Waits {
    client: CoordClient,
    parked: Arc<Mutex<HashMap<Vec<Bytes>, Flight>>>,
}

struct Flight {
    id: u64,
    join: mpsc::UnboundedSender<Released>,
}

impl Waits {
    pub fn new(client: CoordClient) -> Self {
        Self {
            client,
            parked: Arc::default(),
        }
    }

    /// Waits until every key (already prefixed) exists; dropping the future gives up its place.
    pub async fn wait(&self, keys: Vec<Bytes>) -> Result<(), Status> {
        let (tx, rx) = oneshot::channel();
        {
            let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
            // A flight that is ending hands the sender back: start a new one then.
            let tx = match parked.get(&keys) {
                Some(f) => f.join.send(tx).err().map(|e| e.0),
                None => Some(tx),
            };
            if let Some(tx) = tx {
                let (join, joiners) = mpsc::unbounded_channel();
                let id = rand::random();
                parked.insert(keys.clone(), Flight { id, join });
                let flight = Parked {
                    waits: self.clone(),
                    keys,
                    id,
                    joiners,
                };
                tokio::spawn(flight.run(vec![tx]));
            }
        }
        rx.await
            .map_err(|_| Status::unavailable("coord-proxy's parked WAIT ended without an answer"))?
    }

    async fn call_wait(&self, keys: Vec<Bytes>) -> Result<(), Status> {
        let req = pb::RawKeysRequest { keys };
        self.client
            .forward_in(
                None,
                req,
                true,
                |ch, r| async move { raw(ch).wait(r).await },
            )
            .await
            .map(|_| ())
    }

    async fn call_check(&self, keys: Vec<Bytes>) -> Result<bool, Status> {
        let req = pb::RawKeysRequest { keys };
        self.client
            .forward_in(
                None,
                req,
                false,
                |ch, r| async move { raw(ch).check(r).await },
            )
            .await
            .map(|r| r.ready)
    }
}

/// One parked call for one set of keys and the waiters it serves.
struct Parked {
    waits: Waits,
    keys: Vec<Bytes>,
    id: u64,
    joiners: mpsc::UnboundedReceiver<Released>,
}

impl Parked {
    /// Serves `members` (there before the call is sent) and whoever joins, until nobody waits.
    async fn run(mut self, mut members: Vec<Released>) {
        let mut joined = Vec::new();
        loop {
            // Park until the keys exist, taking joiners meanwhile; give up when nobody waits.
            let outcome = {
                let call = self.waits.call_wait(self.keys.clone());
                tokio::pin!(call);
                loop {
                    tokio::select! {
                        r = &mut call => break Some(r),
                        Some(j) = self.joiners.recv() => joined.push(j),
                        () = tokio::time::sleep(PRUNE_EVERY) => {
                            members.retain(|m| !m.is_closed());
                            joined.retain(|m: &Released| !m.is_closed());
                            if members.is_empty() && joined.is_empty() {
                                break None;
                            }
                        }
                    }
                }
            };
            match outcome {
                Some(Ok(())) => release(&mut members, Ok(())),
                Some(Err(s)) => {
                    release(&mut members, Err(s.clone()));
                    self.take_joiners(&mut joined);
                    release(&mut joined, Err(s));
                }
                None => {}
            }
            // Joiners arrived after the call was sent: a CHECK sent now decides for them.
            while !joined.is_empty() {
                self.take_joiners(&mut joined);
                let checking = std::mem::take(&mut joined);
                match self.waits.call_check(self.keys.clone()).await {
                    Ok(true) => release(&mut { checking }, Ok(())),
                    Ok(false) => {
                        members = checking;
                        break;
                    }
                    Err(s) => release(&mut { checking }, Err(s)),
                }
                // Whoever joined during the CHECK goes round again.
                self.take_joiners(&mut joined);
            }
            members.retain(|m| !m.is_closed());
            if members.is_empty() {
                if self.end() {
                    return;
                }
                // They joined before the next call leaves: its answer serves them.
                self.take_joiners(&mut members);
            }
        }
    }

    fn take_joiners(&mut self, into: &mut Vec<Released>) {
        while let Ok(j) = self.joiners.try_recv() {
            into.push(j);
        }
    }

    /// Leaves the table if no one joined in the meantime (then the next WAIT starts a new call);
    /// false if someone did, and the loop serves them.
    fn end(&mut self) -> bool {
        let mut parked = self
            .waits
            .parked
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !self.joiners.is_empty() {
            return false;
        }
        if parked.get(&self.keys).is_some_and(|f| f.id == self.id) {
            parked.remove(&self.keys);
        }
        // Senders are only used under the lock: none can arrive now.
        self.joiners.close();
        true
    }
}

fn release(waiters: &mut Vec<Released>, outcome: Result<(), Status>) {
    for w in waiters.drain(..) {
        let _ = w.send(outcome.clone());
    }
}

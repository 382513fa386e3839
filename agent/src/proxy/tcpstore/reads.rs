//! GETs of many torch connections, sent to the ensemble together.
//!
//! A burst of ranks (`init_process_group` on thousands of processes) sends thousands of GETs at
//! once, and each would be a gRPC call of its own to the leader and a share of a read-index round
//! there: in a 4096-rank burst that was a quarter of coord's time. Here the GETs waiting when a
//! flight leaves go in one `RawKeys.Get`, and those that arrive while it is out go in the next.
//! Every GET still leaves after it arrived, and the leader confirms its leadership after the
//! flight reached it, so each answer stays linearizable; one connection alone sees one call per
//! GET, as before.
//!
//! One connection's bad request must not fail its neighbours': a flight of several GETs that the
//! ensemble refuses (a value too large for one answer, say) is sent again one GET per call, so
//! each gets its own verdict.

use bytes::Bytes;
use coord_proto::coord::kv as pb;
use coord_proto::coord::kv::raw_keys_client::RawKeysClient;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use crate::client::{Channel, CoordClient};

/// Largest request or answer the proxy exchanges with a replica: a value at torch's limit and
/// then some.
const MESSAGE_LIMIT: usize = 64 << 20;

/// The ensemble's raw keys on `ch`, with the proxy's message limits.
pub fn raw(ch: Channel) -> RawKeysClient<Channel> {
    RawKeysClient::new(ch)
        .max_decoding_message_size(MESSAGE_LIMIT)
        .max_encoding_message_size(MESSAGE_LIMIT)
}

/// At most this many GETs, or keys, in one flight.
const MAX_FLIGHT_GETS: usize = 256;
const MAX_FLIGHT_KEYS: usize = 4096;

type Values = Result<Vec<Bytes>, Status>;

struct Get {
    keys: Vec<Bytes>,
    reply: oneshot::Sender<Values>,
}

/// The flights of one proxy's GETs (cloned into every connection's [`super::Store`]).
#[derive(Clone)]
pub struct Reads {
    tx: mpsc::UnboundedSender<Get>,
}

impl Reads {
    /// Starts the task that sends the flights; it ends when every `Reads` is dropped.
    pub fn start(client: CoordClient) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(flights(client, rx));
        Self { tx }
    }

    /// The values of `keys` (already prefixed), a missing key's empty.
    pub async fn get(&self, keys: Vec<Bytes>) -> Values {
        let (reply, answer) = oneshot::channel();
        let gone = || Status::unavailable("coord-proxy's reads task has stopped");
        self.tx.send(Get { keys, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn flights(client: CoordClient, mut rx: mpsc::UnboundedReceiver<Get>) {
    while let Some(first) = rx.recv().await {
        let mut keys = first.keys.len();
        let mut flight = vec![first];
        while flight.len() < MAX_FLIGHT_GETS && keys < MAX_FLIGHT_KEYS {
            let Ok(next) = rx.try_recv() else { break };
            keys += next.keys.len();
            flight.push(next);
        }
        let all: Vec<Bytes> = flight.iter().flat_map(|g| g.keys.iter().cloned()).collect();
        match call(&client, all).await {
            Ok(values) => {
                // Each GET's values in turn (the call answered one per key, in order).
                let mut values = values.into_iter();
                for g in flight {
                    let own = values.by_ref().take(g.keys.len()).collect();
                    let _ = g.reply.send(Ok(own));
                }
            }
            // No replica could serve it: the same for every GET of the flight.
            Err(s) if flight.len() == 1 || s.code() == Code::Unavailable => {
                for g in flight {
                    let _ = g.reply.send(Err(s.clone()));
                }
            }
            Err(_) => {
                for g in flight {
                    let _ = g.reply.send(call(&client, g.keys).await);
                }
            }
        }
    }
}

/// One `RawKeys.Get` of `keys`: their values, a missing key's empty (torch's server answers so).
async fn call(client: &CoordClient, keys: Vec<Bytes>) -> Values {
    let n = keys.len();
    let req = pb::RawGetRequest { keys };
    let resp = client
        .forward_in(
            None,
            req,
            false,
            |ch, r| async move { raw(ch).get(r).await },
        )
        .await?;
    if resp.values.len() != n {
        return Err(Status::internal(format!(
            "the ensemble answered {} values for {n} keys",
            resp.values.len()
        )));
    }
    Ok(resp.values.into_iter().map(|v| v.value).collect())
}

//! GetAliveTasks through a follower: each call's ask recorded on the leader at once, and one wait
//! on the leader per round for all the follower's callers of it.
//!
//! Relayed as it came, each call parked on the leader until its round finished and came back
//! with a copy of the round's answer of its own: a 10,000-task job's round cost the follower's
//! link 10,000 copies of a 100 KB answer (1 GB), and 5.2–5.8 s against the leader's own 0.8 s.
//! Instead the follower records the call's ask as a sidecar records its tasks' asks
//! (`coordination/XlaAliveAsks`, under the call's own request id, so that one sent again after a
//! leader change is recorded once; the asks about a set that come while one such call is on its
//! way go together in the next, the set listed once: see `api::relayed_asks`), and waits on the
//! round the ask joined with one `coordination/AwaitAlive` for every caller of the round (see
//! `api::relayed_waits`), whose answer each of them is sent from the one buffer it came in.
//!
//! A leader that does not know `XlaAliveAsks` (an older replica, mid-upgrade) answers
//! UNIMPLEMENTED; the call is then relayed as it came.

use std::sync::Arc;

use coord_proto::coord::coordination::{
    AliveSet, AwaitAliveRequest, BarrierAnswer, XlaAliveAsksRequest,
};
use coord_proto::metadata::{final_status, WireRequestId};
use coord_proto::xla::coordination as xla;
use coord_raft_store::state::TaskSet;
use futures::FutureExt;
use tonic::metadata::MetadataMap;
use tonic::{Response, Status};

use super::alive::GET_ALIVE_TASKS;
use super::errors::id_of;
use super::{Asked, XlaService};
use crate::api::relayed_waits::{unknown_to_the_leader, with_metadata};
use crate::api::shared_answer::AnswerBytes;
use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::namespace;

/// How long a call recording asks may take. It answers once the asks are committed; past this
/// the link to the leader is likely cut (a call that never ends would hold back every later ask
/// of its set), and the callers' routing drives them again, the request ids making that safe.
const RECORDED_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

impl XlaService {
    /// A follower's GetAliveTasks call of `requesting_task_id` about `set`, forwarded with
    /// `metadata` (the forward's mark, the call's request id and namespace): its ask recorded on
    /// the leader (channel `ch`), then its round's answer as the leader encoded it, waited on
    /// once for every caller of the round.
    pub(super) async fn relay_round(
        &self,
        ch: PeerChannel,
        metadata: MetadataMap,
        requesting_task_id: i32,
        incarnations: Option<xla::Incarnations>,
        set: TaskSet,
    ) -> Result<Response<Arc<AnswerBytes>>, Status> {
        let id = WireRequestId::read(&metadata).ok().flatten();
        let ask = xla::GetAliveTasksRequest {
            requesting_task_id,
            incarnations,
            task_ids: Vec::new(),
        };
        let kind = (namespace::current(), id.map(|id| id.client), set.clone());
        let asked = (ask.clone(), id, ch.clone(), metadata.clone());
        let asked_about = set.clone();
        let recorded = (self.asks)
            .answer(kind, asked, move |asks| {
                recorded_together(asks, ids_of(&asked_about))
            })
            .await;
        let generation = match recorded {
            Ok(round) => round?,
            Err(s) if unknown_to_the_leader(&s) => {
                let ask = xla::GetAliveTasksRequest {
                    task_ids: ids_of(&set),
                    ..ask
                };
                return self
                    .relay(ch, with_metadata(&metadata, ask), GET_ALIVE_TASKS)
                    .await;
            }
            Err(s) => return Err(s),
        };
        let task_ids = ids_of(&set);
        let key = (namespace::current(), set, generation);
        let answer = self.rounds.answer(key, || {
            let req = with_metadata(
                &metadata,
                AwaitAliveRequest {
                    task_ids,
                    generation: generation as i64,
                },
            );
            async move {
                coord_proto::codec::call_undecoded(
                    ch,
                    req,
                    "/coord.coordination.Coordination/AwaitAlive",
                    PEER_MESSAGE_LIMIT,
                    false,
                )
                .await
                .map(|answer| Arc::new(AnswerBytes::raw(answer.get_ref())))
            }
            .boxed()
        });
        answer.await.map(Response::new)
    }
}

/// Records `asks` about the set of `task_ids` on the leader in one call: each ask's own error
/// (marked as the service's answer, as the leader marks it), else the round it joined, in
/// order. The call goes on the newest ask's channel under its metadata (the leader its routing
/// saw last), the asks numbered under their client with the oldest `acked_below` among them.
async fn recorded_together(
    asks: Vec<Asked>,
    task_ids: Vec<i32>,
) -> Result<Vec<Result<u64, Status>>, Status> {
    let n = asks.len();
    let mut ids = Vec::with_capacity(n);
    let mut requests = Vec::with_capacity(n);
    let mut last = None;
    for (ask, id, ch, metadata) in asks {
        requests.push(ask);
        ids.extend(id);
        last = Some((ch, metadata));
    }
    let Some((ch, mut metadata)) = last else {
        return Ok(Vec::new());
    };
    // The asks of one kind share a client: all numbered, or (calls that carried no id) none.
    let ask_seqs = if ids.len() == n {
        ids.iter().map(|id| id.seq).collect()
    } else {
        Vec::new()
    };
    let acked_below = ids.iter().map(|id| id.acked_below).min();
    if let (Some(first), Some(acked_below)) = (ids.first(), acked_below) {
        WireRequestId {
            acked_below,
            ..*first
        }
        .write(&mut metadata);
    }
    crate::api::relayed_asks::ALIVE_ASKS.call(n);
    let asks = XlaAliveAsksRequest {
        sets: vec![AliveSet { task_ids }],
        set: vec![0; n],
        asks: requests,
        ask_seqs,
    };
    let mut client = crate::api::coordination::client(ch);
    let call = client.xla_alive_asks(with_metadata(&metadata, asks));
    let answered = tokio::time::timeout(RECORDED_WITHIN, call)
        .await
        .map_err(|_| {
            Status::unavailable(format!(
                "the leader recorded no GetAliveTasks ask within {} s",
                RECORDED_WITHIN.as_secs()
            ))
        })??;
    Ok(answered
        .into_inner()
        .answers
        .into_iter()
        .map(|a| match a.error_code {
            0 => round_of(a),
            _ => Err(final_status(a.error_code, a.error_message, a.error_details)),
        })
        .collect())
}

/// The XLA task ids of `set`, as a task's own call lists them.
fn ids_of(set: &TaskSet) -> Vec<i32> {
    set.iter().map(|t| id_of(&t)).collect()
}

/// The round the ask joined.
fn round_of(a: BarrierAnswer) -> Result<u64, Status> {
    u64::try_from(a.counter).map_err(|_| {
        Status::internal(format!(
            "the leader answered round {} of GetAliveTasks",
            a.counter
        ))
    })
}

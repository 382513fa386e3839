//! GetAliveTasks through a follower: each call's ask recorded on the leader at once, and one wait
//! on the leader per round for all the follower's callers of it.
//!
//! Relayed as it came, each call parked on the leader until its round finished and came back
//! with a copy of the round's answer of its own: a 10,000-task job's round cost the follower's
//! link 10,000 copies of a 100 KB answer (1 GB), and 5.2–5.8 s against the leader's own 0.8 s.
//! Instead the follower records the call's ask as a sidecar records its tasks' asks
//! (`coordination/XlaAliveAsks`, under the call's own request id, so that one sent again after a
//! leader change is recorded once), and waits on the round the ask joined with one
//! `coordination/AwaitAlive` for every caller of the round (see `api::relayed_waits`), whose
//! answer each of them is sent from the one buffer it came in.
//!
//! A leader that does not know `XlaAliveAsks` (an older replica, mid-upgrade) answers
//! UNIMPLEMENTED; the call is then relayed as it came.

use std::sync::Arc;

use coord_proto::coord::coordination::{
    AliveSet, AwaitAliveRequest, BarrierAnswer, XlaAliveAsksRequest,
};
use coord_proto::xla::coordination as xla;
use coord_raft_store::state::TaskSet;
use futures::FutureExt;
use tonic::metadata::MetadataMap;
use tonic::{Response, Status};

use super::alive::GET_ALIVE_TASKS;
use super::errors::id_of;
use super::XlaService;
use crate::api::relayed_waits::{recorded as recorded_one, unknown_to_the_leader, with_metadata};
use crate::api::shared_answer::AnswerBytes;
use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::namespace;

/// Asks a follower records on the leader at once. Each carries its call's list of the tasks
/// asked about (a whole job's: 10,000 ids, some 65 KB as the leader reads it), and unbounded, a
/// 10,000-task round through a follower had the leader holding 10,000 such asks at once (its RSS
/// 0.7 GB, against 0.17–0.25 GB when each call was relayed as it came).
const ASKS_AT_ONCE: usize = 256;
static ASKING: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(ASKS_AT_ONCE);

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
        let task_ids: Vec<i32> = set.iter().map(|t| id_of(&t)).collect();
        let seq = coord_proto::metadata::WireRequestId::read(&metadata)
            .ok()
            .flatten()
            .map(|id| id.seq);
        let ask = xla::GetAliveTasksRequest {
            requesting_task_id,
            incarnations,
            task_ids: Vec::new(),
        };
        let asks = XlaAliveAsksRequest {
            sets: vec![AliveSet {
                task_ids: task_ids.clone(),
            }],
            asks: vec![ask.clone()],
            set: vec![0],
            ask_seqs: seq.into_iter().collect(),
        };
        let recorded = {
            let _asking = ASKING.acquire().await;
            crate::api::coordination::client(ch.clone())
                .xla_alive_asks(with_metadata(&metadata, asks))
                .await
        };
        let generation = match recorded {
            Ok(r) => round_of(recorded_one(r.into_inner().answers)?)?,
            Err(s) if unknown_to_the_leader(&s) => {
                let ask = xla::GetAliveTasksRequest { task_ids, ..ask };
                return self
                    .relay(ch, with_metadata(&metadata, ask), GET_ALIVE_TASKS)
                    .await;
            }
            Err(s) => return Err(s),
        };
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

/// The round the ask joined.
fn round_of(a: BarrierAnswer) -> Result<u64, Status> {
    u64::try_from(a.counter).map_err(|_| {
        Status::internal(format!(
            "the leader answered round {} of GetAliveTasks",
            a.counter
        ))
    })
}

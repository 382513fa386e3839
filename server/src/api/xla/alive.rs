//! XLA's GetAliveTasks, answered from one encoding per round.
//!
//! Every asker of a round gets the same answer: the live tasks of the set, and jax's
//! `live_devices` asks about every task of the job, so a job of N tasks is sent N answers of N
//! tasks. The round's answer is one `Arc` in the state (see `state::alive`); here it is encoded
//! once (and gzipped once, for the callers that accept gzip) and every caller's response body is
//! that buffer, by reference, as WaitForAllTasks' is (see [`crate::api::shared_answer`]).
//! Encoded per caller, a 10,000-task job's round held about 1 GB of answers on the leader.
//!
//! The request names every task too (4 bytes each), and a parked call lives as long as the
//! round: the call is read into an [`Ask`], its list as runs, before it is routed, so what waits
//! is a few bytes rather than the list (the router keeps the message to drive the call again
//! after a leader change, and each attempt its own copy: 80 KB a call at 10,000 tasks).
//!
//! A sidecar carrying several tasks parks none of their calls: it records their asks together
//! (`coordination/XlaAliveAsks`, each set they ask about sent and read once, each ask checked by
//! [`XlaService::alive_named_with`]) and waits on the round with one `coordination/AwaitAlive`
//! call ([`XlaService::await_alive_call`]), answered from the same encoding.
//!
//! A follower records each call's ask on the leader as a sidecar does, and waits on the round
//! with one `AwaitAlive` for all its callers of it (see `rounds`); a list it cannot read as tasks
//! of its job is relayed as it came, for the leader to say why.

/// jaxlib's GetAliveTasks, as a follower relays a call it cannot read to the leader.
pub(super) const GET_ALIVE_TASKS: &str = "/xla.coordination.CoordinationService/GetAliveTasks";

use std::sync::Arc;

use coord_proto::coord::coordination::AwaitAliveRequest;
use coord_proto::xla::coordination as xla;
use coord_raft_store::state::{AliveAnswer, TaskName, TaskSet};
use futures::future::Either;
use futures::FutureExt;
use tonic::{Request, Response, Status};

use super::errors::id_of;
use super::{answered_from_shared, served, XlaService};
use crate::api::shared_answer::AnswerBytes;
use crate::error::CoordError;
use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::route::Kind;

/// A GetAliveTasks request as it is routed and waits.
#[derive(Clone)]
enum Ask {
    /// The tasks asked about, as runs of task numbers.
    Runs {
        requesting_task_id: i32,
        incarnations: Option<xla::Incarnations>,
        set: TaskSet,
    },
    /// As it came: a list this replica could not read as tasks of its job (the leader says why).
    Listed(xla::GetAliveTasksRequest),
}

impl Ask {
    fn requesting_task_id(&self) -> i32 {
        match self {
            Ask::Runs {
                requesting_task_id, ..
            } => *requesting_task_id,
            Ask::Listed(m) => m.requesting_task_id,
        }
    }

    fn incarnations(&self) -> Option<&xla::Incarnations> {
        match self {
            Ask::Runs { incarnations, .. } => incarnations.as_ref(),
            Ask::Listed(m) => m.incarnations.as_ref(),
        }
    }

    /// The request on jaxlib's wire, to forward to the leader.
    fn into_request(self) -> xla::GetAliveTasksRequest {
        match self {
            Ask::Runs {
                requesting_task_id,
                incarnations,
                set,
            } => xla::GetAliveTasksRequest {
                requesting_task_id,
                task_ids: set.iter().map(|t| id_of(&t)).collect(),
                incarnations,
            },
            Ask::Listed(m) => m,
        }
    }
}

impl XlaService {
    /// GetAliveTasks: once every live task of the set asked, the live ones and their
    /// incarnations.
    ///
    /// Not an `async fn`: one keeps its request beside the route it is handed to, for as long as
    /// the call waits.
    pub(super) fn get_alive_call(
        &self,
        req: Request<xla::GetAliveTasksRequest>,
    ) -> impl std::future::Future<Output = Result<Response<xla::GetAliveTasksResponse>, Status>> + '_
    {
        if let Err(s) = self.acting_as(
            &req,
            "xla/GetAliveTasks",
            "requesting_task_id",
            req.get_ref().requesting_task_id,
        ) {
            return Either::Left(std::future::ready(Err(s)));
        }
        let req = req.map(|m| match self.task_set(&m.task_ids, "task_ids") {
            Ok(set) => Ask::Runs {
                requesting_task_id: m.requesting_task_id,
                incarnations: m.incarnations,
                set,
            },
            Err(_) => Ask::Listed(m),
        });
        let this = self;
        let routed = self.router.route(
            "xla/GetAliveTasks",
            Kind::Write,
            req,
            move |ask, id| {
                served(async move {
                    this.check_incarnation(ask.incarnations())?;
                    let source = this.task(ask.requesting_task_id(), "requesting_task_id")?;
                    let set = match ask {
                        Ask::Runs { set, .. } => set,
                        Ask::Listed(m) => this.task_set(&m.task_ids, "task_ids")?,
                    };
                    let alive = this.coord.get_alive(id, source, set).await?;
                    Ok(this.encoded(&alive))
                })
            },
            move |ch, r| match r.into_parts() {
                (
                    metadata,
                    _,
                    Ask::Runs {
                        requesting_task_id,
                        incarnations,
                        set,
                    },
                ) => Either::Left(this.relay_round(
                    ch,
                    metadata,
                    requesting_task_id,
                    incarnations,
                    set,
                )),
                (metadata, extensions, ask) => {
                    let r = Request::from_parts(metadata, extensions, ask.into_request());
                    Either::Right(this.relay(ch, r, GET_ALIVE_TASKS))
                }
            },
        );
        Either::Right(routed.map(answered_from_shared))
    }

    /// The task and set a GetAliveTasks call names, checked as that call checks them (its
    /// service incarnation first): how an ask a sidecar sends with others is read. The set asked
    /// about is `set` (read once for the asks of a call that share it), read only once the task
    /// is checked.
    pub(crate) fn alive_named_with(
        &self,
        m: &xla::GetAliveTasksRequest,
        set: impl FnOnce() -> Result<TaskSet, CoordError>,
    ) -> Result<(TaskName, TaskSet), CoordError> {
        self.check_incarnation(m.incarnations.as_ref())
            .and_then(|()| self.task(m.requesting_task_id, "requesting_task_id"))
            .and_then(|source| Ok((source, set()?)))
    }

    /// The set of GetAliveTasks' `task_ids`, or the error the task's own call ends with.
    pub(crate) fn alive_set(&self, task_ids: &[i32]) -> Result<TaskSet, CoordError> {
        self.task_set(task_ids, "task_ids")
    }

    /// `coordination/AwaitAlive`: round `generation` of GetAliveTasks over `task_ids`, answered
    /// from the round's one encoding, as every task's own call of the round is.
    pub(crate) fn await_alive_call(
        &self,
        req: Request<AwaitAliveRequest>,
    ) -> impl std::future::Future<Output = Result<Response<xla::GetAliveTasksResponse>, Status>> + '_
    {
        let this = self;
        let routed = self.router.route(
            "coordination/AwaitAlive",
            Kind::Read,
            req,
            move |m, _| {
                served(async move {
                    let generation = u64::try_from(m.generation).map_err(|_| {
                        CoordError::InvalidArgument(format!(
                            "generation: round {} of GetAliveTasks is negative",
                            m.generation
                        ))
                    })?;
                    let set = this.task_set(&m.task_ids, "task_ids")?;
                    let alive = this.coord.await_alive(set, generation).await?;
                    Ok(this.encoded(&alive))
                })
            },
            move |ch, r| this.relay(ch, r, "/coord.coordination.Coordination/AwaitAlive"),
        );
        routed.map(answered_from_shared)
    }

    /// Method `path` on the leader's channel `ch`: the round's answer as the leader encoded it,
    /// shared with the other callers of the round that this replica relays.
    pub(super) async fn relay<Req: prost::Message + Send + 'static>(
        &self,
        ch: PeerChannel,
        req: Request<Req>,
        path: &'static str,
    ) -> Result<Response<Arc<AnswerBytes>>, Status> {
        let answer =
            coord_proto::codec::call_undecoded(ch, req, path, PEER_MESSAGE_LIMIT, false).await?;
        Ok(answer.map(|message| self.relayed.of(&message)))
    }

    /// A round's answer, encoded once for every caller that gets it.
    fn encoded(&self, alive: &AliveAnswer) -> Arc<AnswerBytes> {
        self.alive.of(alive, |alive| {
            AnswerBytes::encode(&xla::GetAliveTasksResponse {
                alive_task_ids: alive.iter().map(|(t, _)| id_of(t)).collect(),
                incarnations: alive.iter().map(|(_, i)| *i).collect(),
                ..Default::default()
            })
        })
    }
}

//! `coord.coordination.Coordination`: how agents learn of errors (a long poll, re-driven across
//! leader changes by its sequence number), read task states, and how a sidecar sends the
//! heartbeats and barrier arrivals of the tasks it carries together.
//!
//! TensorFlow's agents heartbeat every 5 s: 20,000 calls a second for a job of 100,000 tasks, each
//! an HTTP/2 stream with its headers and trailers, which costs the leader more than the heartbeat
//! itself. A sidecar carrying several tasks of a host holds their heartbeats a moment and sends
//! them together ([`Coordination::heartbeats`]); each is answered as its own call would have been.
//! Likewise its tasks' barrier arrivals are recorded together, and it waits on each instance with
//! one call ([`Coordination::barrier_arrivals`], [`Coordination::await_barrier`], see
//! `serve::coordination::arrivals`), and jaxlib's GetAliveTasks asks, each set they ask about
//! sent once, waited on per round ([`Coordination::xla_alive_asks`], [`Coordination::await_alive`];
//! [`Coordination::xla_alive_arrivals`] is the earlier form, each ask with its own list).

use std::sync::Arc;

use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use coord_proto::coord::coordination as pb;
use coord_proto::coord::coordination::coordination_client::CoordinationClient;
use coord_proto::coord::coordination::coordination_server::Coordination;
use coord_proto::tensorflow as tf;
use coord_proto::xla::coordination as xla;
use tonic::{Request, Response, Status};

use crate::api::wire::{error_payload, state_to, task_from, task_to, tasks_from};
use crate::api::xla::XlaService;
use crate::error::grpc_code;
use crate::serve::coordination::CoordCore;
use crate::serve::route::{Kind, Router};

mod answers;

use answers::{
    alive_asks_answered, all_answered, arrival_answer, arrivals_as_asks, arrivals_numbered,
    asks_well_formed, barrier_answer, beat_answer, wait_arrival_answer, xla_arrival_answer,
};

pub struct CoordService {
    router: Arc<Router>,
    core: Arc<CoordCore>,
    /// jaxlib's service: how its requests name tasks and are checked (for its arrivals).
    xla: Arc<XlaService>,
}

impl CoordService {
    pub fn new(router: Arc<Router>, core: Arc<CoordCore>, xla: Arc<XlaService>) -> Self {
        Self { router, core, xla }
    }

    /// Admits a call carrying `n` of `what`: at most `what.limit` (more is RESOURCE_EXHAUSTED
    /// naming the limit).
    fn admit_count(&self, method: &'static str, what: Items, n: usize) -> Result<(), Status> {
        let Items { name, limit, .. } = what;
        if n > limit {
            let over = Status::resource_exhausted(format!(
                "{method}: {n} {name} in one call, over the limit of {limit}; send them in \
                 several calls"
            ));
            self.router.checked(method, Err(over))?;
        }
        Ok(())
    }

    /// Admits a call carrying several tasks' `items`: at most `what.limit` of them, each naming a
    /// task the caller may act as.
    fn admit<T, I>(
        &self,
        req: &Request<T>,
        method: &'static str,
        what: Items,
        items: &[I],
        task_of: impl Fn(&I) -> Option<&tf::CoordinatedTask>,
    ) -> Result<(), Status> {
        self.admit_count(method, what, items.len())?;
        let Items { name, task, .. } = what;
        for (i, item) in items.iter().enumerate() {
            let field = format!("{name}[{i}].{task}");
            self.router.check_task(req, method, &field, task_of(item))?;
        }
        Ok(())
    }
}

impl CoordService {
    /// Admits a call carrying several of jaxlib's requests, which name their tasks by XLA's
    /// `ids`: at most `what.limit`, each naming a task the caller may act as.
    fn admit_xla<T>(
        &self,
        req: &Request<T>,
        method: &'static str,
        what: Items,
        ids: Vec<i32>,
    ) -> Result<(), Status> {
        self.admit_count(method, what, ids.len())?;
        let Items { name, task, .. } = what;
        for (i, id) in ids.into_iter().enumerate() {
            let field = format!("{name}[{i}].{task}");
            self.xla.acting_as(req, method, &field, id)?;
        }
        Ok(())
    }
}

/// What a call carrying several tasks' items calls them, the field naming each one's task, and how
/// many one call may carry.
#[derive(Clone, Copy)]
struct Items {
    name: &'static str,
    task: &'static str,
    limit: usize,
}

impl Items {
    const fn new(name: &'static str, task: &'static str, limit: usize) -> Items {
        Items { name, task, limit }
    }
}

/// The beats of [`Coordination::heartbeats`].
const BEATS: Items = Items::new("beats", "task", MAX_BEATS);

/// The arrivals of [`Coordination::barrier_arrivals`] and
/// [`Coordination::wait_for_all_tasks_arrivals`].
const ARRIVALS: Items = Items::new("arrivals", "source_task", MAX_ARRIVALS);

/// The arrivals of [`Coordination::xla_barrier_arrivals`], which name tasks by XLA's ids.
const XLA_ARRIVALS: Items = Items::new("arrivals", "source_task_id", MAX_ARRIVALS);

/// The arrivals of [`Coordination::xla_alive_arrivals`].
const XLA_ALIVE_ARRIVALS: Items = Items::new("arrivals", "requesting_task_id", MAX_ARRIVALS);

/// The asks of [`Coordination::xla_alive_asks`], and the sets they ask about.
const XLA_ALIVE_ASKS: Items = Items::new("asks", "requesting_task_id", MAX_ARRIVALS);
const XLA_ALIVE_SETS: Items = Items::new("sets", "", MAX_ARRIVALS);

/// Most heartbeats one call may carry: a sidecar carries the tasks of one host, and a call this
/// large still answers in a few milliseconds.
pub const MAX_BEATS: usize = 65_536;

/// Most barrier arrivals one call may carry, as heartbeats.
pub const MAX_ARRIVALS: usize = MAX_BEATS;

pub(crate) fn client(ch: PeerChannel) -> CoordinationClient<PeerChannel> {
    CoordinationClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

#[tonic::async_trait]
impl Coordination for CoordService {
    async fn poll_for_error(
        &self,
        req: Request<pb::PollForErrorRequest>,
    ) -> Result<Response<pb::PollForErrorResponse>, Status> {
        self.router.check_task(
            &req,
            "coordination/PollForError",
            "task",
            req.get_ref().task.as_ref(),
        )?;
        let core = &*self.core;
        self.router
            .route(
                "coordination/PollForError",
                Kind::Read,
                req,
                |m, _| async move {
                    let task = task_from(m.task.as_ref(), "task")?;
                    let e = core.poll_error(task, m.after_seq).await?;
                    Ok(pb::PollForErrorResponse {
                        seq: e.seq,
                        error_code: grpc_code(e.error.code) as i32,
                        error_message: format!(
                            "task {} failed: {}",
                            e.error.source, e.error.message
                        ),
                        error_payload: Some(error_payload(&e.error)),
                    })
                },
                |ch, r| async move { client(ch).poll_for_error(r).await },
            )
            .await
    }

    /// Each beat as TensorFlow's Heartbeat (`api::tf`), under the same check of the caller: a task's
    /// certificate may send only its own.
    async fn heartbeats(
        &self,
        req: Request<pb::HeartbeatsRequest>,
    ) -> Result<Response<pb::HeartbeatsResponse>, Status> {
        const METHOD: &str = "coordination/Heartbeats";
        let beats = &req.get_ref().beats;
        self.admit(&req, METHOD, BEATS, beats, |b| b.task.as_ref())?;
        let core = &*self.core;
        self.router
            .route(
                METHOD,
                Kind::Read,
                req,
                |m, _| async move {
                    let answers = m
                        .beats
                        .iter()
                        .enumerate()
                        .map(|(i, beat)| beat_answer(core, i, beat))
                        .collect::<Result<_, _>>()?;
                    Ok(pb::HeartbeatsResponse { answers })
                },
                |ch, r| async move { client(ch).heartbeats(r).await },
            )
            .await
    }

    /// Each arrival as TensorFlow's Barrier records it (`api::tf`), under the same check of the
    /// caller: a task's certificate may send only its own.
    async fn barrier_arrivals(
        &self,
        req: Request<pb::BarrierArrivalsRequest>,
    ) -> Result<Response<pb::BarrierArrivalsResponse>, Status> {
        const METHOD: &str = "coordination/BarrierArrivals";
        let arrivals = &req.get_ref().arrivals;
        self.admit(&req, METHOD, ARRIVALS, arrivals, |a| a.source_task.as_ref())?;
        let core = &*self.core;
        self.router
            .route(
                METHOD,
                Kind::Write,
                req,
                |m, _| all_answered(m.arrivals.into_iter().map(|a| arrival_answer(core, a))),
                |ch, r| async move { client(ch).barrier_arrivals(r).await },
            )
            .await
    }

    /// Each arrival as TensorFlow's WaitForAllTasks records it (`api::tf`), under the same check of
    /// the caller.
    async fn wait_for_all_tasks_arrivals(
        &self,
        req: Request<pb::WaitForAllTasksArrivalsRequest>,
    ) -> Result<Response<pb::BarrierArrivalsResponse>, Status> {
        const METHOD: &str = "coordination/WaitForAllTasksArrivals";
        let arrivals = &req.get_ref().arrivals;
        self.admit(&req, METHOD, ARRIVALS, arrivals, |a| a.source_task.as_ref())?;
        let core = &*self.core;
        self.router
            .route(
                METHOD,
                Kind::Write,
                req,
                |m, _| all_answered(m.arrivals.into_iter().map(|a| wait_arrival_answer(core, a))),
                |ch, r| async move { client(ch).wait_for_all_tasks_arrivals(r).await },
            )
            .await
    }

    /// Each arrival as jaxlib's Barrier records it (`api::xla`), under the same check of the
    /// caller: a task's certificate may send only its own.
    async fn xla_barrier_arrivals(
        &self,
        req: Request<pb::XlaBarrierArrivalsRequest>,
    ) -> Result<Response<pb::BarrierArrivalsResponse>, Status> {
        const METHOD: &str = "coordination/XlaBarrierArrivals";
        let ids = req.get_ref().arrivals.iter().map(|a| a.source_task_id);
        self.admit_xla(&req, METHOD, XLA_ARRIVALS, ids.collect())?;
        let (core, xla) = (&*self.core, &*self.xla);
        self.router
            .route(
                METHOD,
                Kind::Write,
                req,
                |m, _| {
                    let recorded = m.arrivals.into_iter();
                    all_answered(recorded.map(|a| xla_arrival_answer(core, xla, a)))
                },
                |ch, r| async move { client(ch).xla_barrier_arrivals(r).await },
            )
            .await
    }

    /// Each arrival as jaxlib's GetAliveTasks records it (`api::xla`), under its own request
    /// number, and the same check of the caller: as [`Self::xla_alive_asks`], each arrival's list
    /// a set of its own.
    async fn xla_alive_arrivals(
        &self,
        req: Request<pb::XlaAliveArrivalsRequest>,
    ) -> Result<Response<pb::BarrierArrivalsResponse>, Status> {
        const METHOD: &str = "coordination/XlaAliveArrivals";
        let ids = req.get_ref().arrivals.iter().map(|a| a.requesting_task_id);
        self.admit_xla(&req, METHOD, XLA_ALIVE_ARRIVALS, ids.collect())?;
        self.router.checked(METHOD, arrivals_numbered(&req))?;
        let (core, xla) = (&*self.core, &*self.xla);
        self.router
            .route(
                METHOD,
                Kind::Write,
                req,
                |m, id| alive_asks_answered(core, xla, arrivals_as_asks(m), id),
                |ch, r| async move { client(ch).xla_alive_arrivals(r).await },
            )
            .await
    }

    /// jaxlib's GetAliveTasks asks, each set read once for all the asks about it.
    async fn xla_alive_asks(
        &self,
        req: Request<pb::XlaAliveAsksRequest>,
    ) -> Result<Response<pb::BarrierArrivalsResponse>, Status> {
        const METHOD: &str = "coordination/XlaAliveAsks";
        let ids = req.get_ref().asks.iter().map(|a| a.requesting_task_id);
        self.admit_xla(&req, METHOD, XLA_ALIVE_ASKS, ids.collect())?;
        self.admit_count(METHOD, XLA_ALIVE_SETS, req.get_ref().sets.len())?;
        self.router.checked(METHOD, asks_well_formed(&req))?;
        let (core, xla) = (&*self.core, &*self.xla);
        self.router
            .route(
                METHOD,
                Kind::Write,
                req,
                |m, id| alive_asks_answered(core, xla, m, id),
                |ch, r| async move { client(ch).xla_alive_asks(r).await },
            )
            .await
    }

    async fn await_alive(
        &self,
        req: Request<pb::AwaitAliveRequest>,
    ) -> Result<Response<xla::GetAliveTasksResponse>, Status> {
        self.xla.await_alive_call(req).await
    }

    async fn await_barrier(
        &self,
        req: Request<pb::AwaitBarrierRequest>,
    ) -> Result<Response<pb::BarrierAnswer>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "coordination/AwaitBarrier",
                Kind::Read,
                req,
                |m, _| async move {
                    let decided = core
                        .await_instance(m.barrier_id.clone(), m.counter)
                        .await
                        .map(|outcome| (m.counter, Some(outcome)));
                    // A request that cannot wait (no id, a forgotten instance) is the call's own
                    // error; an instance's failure is its answer.
                    match decided {
                        Err(e) => Err(e),
                        decided => barrier_answer(decided, &m.barrier_id, m.counter),
                    }
                },
                |ch, r| async move { client(ch).await_barrier(r).await },
            )
            .await
    }

    async fn get_task_state(
        &self,
        req: Request<pb::GetTaskStateRequest>,
    ) -> Result<Response<pb::GetTaskStateResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "coordination/GetTaskState",
                Kind::Read,
                req,
                |m, _| async move {
                    let tasks = tasks_from(&m.tasks, "tasks")?;
                    let (service_incarnation, records) = core.task_states(tasks).await?;
                    Ok(pb::GetTaskStateResponse {
                        service_incarnation,
                        tasks: records
                            .into_iter()
                            .map(|(t, r)| pb::TaskStateInfo {
                                task: Some(task_to(&t)),
                                state: state_to(r.state) as i32,
                                incarnation: r.incarnation,
                                error_code: r
                                    .error
                                    .as_ref()
                                    .map_or(0, |e| grpc_code(e.code) as i32),
                                error_message: r
                                    .error
                                    .as_ref()
                                    .map_or_else(String::new, |e| e.message.clone()),
                                error_payload: r.error.as_ref().map(error_payload),
                            })
                            .collect(),
                    })
                },
                |ch, r| async move { client(ch).get_task_state(r).await },
            )
            .await
    }
}

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
//! `serve::coordination::arrivals`), and jaxlib's GetAliveTasks asks, waited on per round
//! ([`Coordination::xla_alive_arrivals`], [`Coordination::await_alive`]).

use std::sync::Arc;

use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use coord_proto::coord::coordination as pb;
use coord_proto::coord::coordination::coordination_client::CoordinationClient;
use coord_proto::coord::coordination::coordination_server::Coordination;
use coord_proto::tensorflow as tf;
use coord_proto::xla::coordination as xla;
use coord_raft_store::state::{Outcome, TaskName};
use coord_raft_store::RequestId;
use tonic::{Request, Response, Status};

use crate::api::payloads::{barrier_error, detailed_with};
use crate::api::tf::{devices_of, heartbeat_answer};
use crate::api::wire::{error_payload, state_to, task_from, task_to, tasks_from};
use crate::api::xla::errors::detailed;
use crate::api::xla::XlaService;
use crate::error::{grpc_code, CoordError};
use crate::ops::request_id;
use crate::serve::coordination::CoordCore;
use crate::serve::route::{Kind, Router};

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

/// Checks that `XlaAliveArrivals` numbers its arrivals as it must: one number per arrival or
/// none, and numbers only under a request id of the caller's own (a replica would number the
/// arrivals under its own client, where they could be taken for its other requests).
fn numbered(req: &Request<pb::XlaAliveArrivalsRequest>) -> Result<(), Status> {
    let m = req.get_ref();
    let (seqs, arrivals) = (m.arrival_seqs.len(), m.arrivals.len());
    if seqs == 0 {
        return Ok(());
    }
    if seqs != arrivals {
        return Err(Status::invalid_argument(format!(
            "arrival_seqs: {seqs} numbers for {arrivals} arrivals; send one per arrival, or none"
        )));
    }
    match request_id::from_metadata(req.metadata()).map_err(Status::from)? {
        Some(_) => Ok(()),
        None => Err(Status::invalid_argument(format!(
            "arrival_seqs number the arrivals under the call's client, but the call carries no \
             {} metadata",
            coord_proto::metadata::REQUEST_ID
        ))),
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

/// Most heartbeats one call may carry: a sidecar carries the tasks of one host, and a call this
/// large still answers in a few milliseconds.
pub const MAX_BEATS: usize = 65_536;

/// Most barrier arrivals one call may carry, as heartbeats.
pub const MAX_ARRIVALS: usize = MAX_BEATS;

/// An error a call of its own would have ended with, as the code, message and status details an
/// answer among several carries.
fn error_fields(e: CoordError) -> (i32, String, Vec<u8>) {
    let s = Status::from(e);
    (
        s.code() as i32,
        s.message().to_string(),
        s.details().to_vec(),
    )
}

/// One beat's answer as its own Heartbeat call would have had it; `Err` for an error the whole
/// call must end with, one that routing re-drives (the leader changed meanwhile).
fn beat_answer(core: &CoordCore, i: usize, beat: &pb::Beat) -> Result<pb::BeatAnswer, CoordError> {
    let answered = task_from(beat.task.as_ref(), &format!("beats[{i}].task"))
        .and_then(|task| heartbeat_answer(core, &task, beat.incarnation));
    match answered.map_err(|e| detailed_with(e, None)) {
        Ok(leader_incarnation) => Ok(pb::BeatAnswer {
            leader_incarnation,
            ..Default::default()
        }),
        Err(e) if e.is_retryable() => Err(e),
        Err(e) => {
            let (error_code, error_message, details) = error_fields(e);
            Ok(pb::BeatAnswer {
                leader_incarnation: 0,
                error_code,
                error_message,
                error_details: details.into(),
            })
        }
    }
}

/// What a task's Barrier call is answered with once its instance is decided (`Outcome`) or it
/// failed by itself (`Err`): TensorFlow's `BarrierError` names the barrier as the task called it.
/// `Err` from this function is an error the whole call must end with (the leader changed).
fn barrier_answer(
    decided: Result<(i64, Option<Outcome>), CoordError>,
    barrier_id: &str,
    asked: i64,
) -> Result<pb::BarrierAnswer, CoordError> {
    arrival_outcome(decided, asked, |e| barrier_error(e, barrier_id, asked))
}

/// An arrival's answer: pending, passed, or failed as its own call fails (`detailed` adds the
/// call's payloads to the error). `Err` is an error the whole call must end with.
fn arrival_outcome(
    decided: Result<(i64, Option<Outcome>), CoordError>,
    asked: i64,
    detailed: impl Fn(CoordError) -> CoordError,
) -> Result<pb::BarrierAnswer, CoordError> {
    let failed = |e: CoordError| {
        let (error_code, error_message, details) = error_fields(detailed(e));
        pb::BarrierAnswer {
            counter: asked,
            error_code,
            error_message,
            error_details: details.into(),
            ..Default::default()
        }
    };
    match decided {
        Ok((counter, None)) => Ok(pb::BarrierAnswer {
            pending: true,
            counter,
            ..Default::default()
        }),
        Ok((counter, Some(Outcome::Passed))) => Ok(pb::BarrierAnswer {
            counter,
            ..Default::default()
        }),
        Ok((_, Some(Outcome::Failed { code, message }))) => {
            Ok(failed(CoordError::status(code, message)))
        }
        Err(e) if e.is_retryable() => Err(e),
        Err(e) => Ok(failed(e)),
    }
}

/// Records one WaitForAllTasks arrival as the task's own call would (its fields named as that call
/// names them); its answer, errors carrying the payloads that call's would.
async fn wait_arrival_answer(
    core: &CoordCore,
    a: tf::WaitForAllTasksRequest,
) -> Result<pb::BarrierAnswer, CoordError> {
    let named = task_from(a.source_task.as_ref(), "source_task")
        .and_then(|task| Ok((task, devices_of(&a)?)));
    let recorded = core.wait_for_all_arrival(named).await;
    arrival_outcome(recorded, 0, |e| detailed_with(e, None))
}

/// Records one arrival as the task's own Barrier call would (its fields named as that call names
/// them, so that the answers are the same); its answer.
async fn arrival_answer(
    core: &CoordCore,
    a: tf::BarrierRequest,
) -> Result<pb::BarrierAnswer, CoordError> {
    let named = task_from(a.source_task.as_ref(), "source_task")
        .and_then(|s| Ok((s, tasks_from(&a.tasks, "tasks")?)));
    recorded_answer(
        core,
        a.barrier_id,
        a.counter,
        a.barrier_timeout_in_ms,
        named,
    )
    .await
}

/// Records one of jaxlib's Barrier arrivals as the task's own call would (see
/// [`XlaService::barrier_named`]); its answer.
async fn xla_arrival_answer(
    core: &CoordCore,
    xla: &XlaService,
    a: xla::BarrierRequest,
) -> Result<pb::BarrierAnswer, CoordError> {
    let named = xla.barrier_named(&a);
    recorded_answer(
        core,
        a.barrier_id,
        a.counter,
        a.barrier_timeout_in_ms,
        named,
    )
    .await
}

/// Records one of jaxlib's GetAliveTasks arrivals as the task's own call would (see
/// [`XlaService::alive_named`]), under request id `id`; its answer: the round it joined.
async fn xla_alive_answer(
    core: &CoordCore,
    xla: &XlaService,
    a: xla::GetAliveTasksRequest,
    id: Option<RequestId>,
) -> Result<pb::BarrierAnswer, CoordError> {
    let recorded = core.alive_arrival(id, xla.alive_named(&a)).await;
    let round = recorded
        .map(|(generation, finished)| (generation as i64, finished.then_some(Outcome::Passed)));
    arrival_outcome(round, 0, detailed)
}

/// Records a barrier arrival of the task and participants `named` (or the error naming them
/// ended with); its answer.
async fn recorded_answer(
    core: &CoordCore,
    barrier_id: String,
    counter: i64,
    timeout_ms: i64,
    named: Result<(TaskName, Vec<TaskName>), CoordError>,
) -> Result<pb::BarrierAnswer, CoordError> {
    let recorded = core
        .barrier_arrival(barrier_id.clone(), counter, timeout_ms, named)
        .await;
    barrier_answer(recorded, &barrier_id, counter)
}

/// Every arrival's answer, in order, the arrivals recorded at once (the proposer puts them in few
/// log entries); an error the whole call must end with ends it.
async fn all_answered<F>(
    recorded: impl Iterator<Item = F>,
) -> Result<pb::BarrierArrivalsResponse, CoordError>
where
    F: std::future::Future<Output = Result<pb::BarrierAnswer, CoordError>>,
{
    let answers = futures::future::join_all(recorded)
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    Ok(pb::BarrierArrivalsResponse { answers })
}

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
    /// number, and the same check of the caller.
    async fn xla_alive_arrivals(
        &self,
        req: Request<pb::XlaAliveArrivalsRequest>,
    ) -> Result<Response<pb::BarrierArrivalsResponse>, Status> {
        const METHOD: &str = "coordination/XlaAliveArrivals";
        let ids = req.get_ref().arrivals.iter().map(|a| a.requesting_task_id);
        self.admit_xla(&req, METHOD, XLA_ALIVE_ARRIVALS, ids.collect())?;
        self.router.checked(METHOD, numbered(&req))?;
        let (core, xla) = (&*self.core, &*self.xla);
        self.router
            .route(
                METHOD,
                Kind::Write,
                req,
                |m, id| {
                    let seqs = m.arrival_seqs;
                    let recorded = m.arrivals.into_iter().enumerate().map(move |(i, a)| {
                        let own = id
                            .zip(seqs.get(i))
                            .map(|(id, &seq)| RequestId { seq, ..id });
                        xla_alive_answer(core, xla, a, own)
                    });
                    all_answered(recorded)
                },
                |ch, r| async move { client(ch).xla_alive_arrivals(r).await },
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

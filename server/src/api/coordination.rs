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
use coord_raft_store::state::{Outcome, TaskName, TaskSet};
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

/// Checks that `XlaAliveArrivals` numbers its arrivals as it must (see [`numbered`]).
fn arrivals_numbered(req: &Request<pb::XlaAliveArrivalsRequest>) -> Result<(), Status> {
    let m = req.get_ref();
    numbered(
        req,
        "arrival_seqs",
        m.arrival_seqs.len(),
        "arrivals",
        m.arrivals.len(),
    )
}

/// Checks an `XlaAliveAsks` call: its asks numbered as they must be (see [`numbered`]), each
/// naming its set by an index `sets` has and listing no tasks of its own.
fn asks_well_formed(req: &Request<pb::XlaAliveAsksRequest>) -> Result<(), Status> {
    let m = req.get_ref();
    numbered(req, "ask_seqs", m.ask_seqs.len(), "asks", m.asks.len())?;
    if m.set.len() != m.asks.len() {
        return Err(Status::invalid_argument(format!(
            "set: {} set indices for {} asks; send one per ask",
            m.set.len(),
            m.asks.len()
        )));
    }
    if let Some((i, k)) = m
        .set
        .iter()
        .enumerate()
        .find(|(_, &k)| k as usize >= m.sets.len())
    {
        return Err(Status::invalid_argument(format!(
            "set[{i}]: no set #{k}: the call sends {} sets",
            m.sets.len()
        )));
    }
    if let Some(i) = m.asks.iter().position(|a| !a.task_ids.is_empty()) {
        return Err(Status::invalid_argument(format!(
            "asks[{i}].task_ids: leave it empty; the tasks asked about are sets[set[{i}]]"
        )));
    }
    Ok(())
}

/// Checks that a call numbering the commands it carries (`what`, `n` of them) under its own
/// client does so as it must: one number per command (`seqs`, `numbers` of them) or none, and
/// numbers only under a request id of the caller's own (a replica would number them under its
/// own client, where they could be taken for its other requests).
fn numbered<T>(
    req: &Request<T>,
    seqs: &str,
    numbers: usize,
    what: &str,
    n: usize,
) -> Result<(), Status> {
    if numbers == 0 {
        return Ok(());
    }
    if numbers != n {
        return Err(Status::invalid_argument(format!(
            "{seqs}: {numbers} numbers for {n} {what}; send one per item, or none"
        )));
    }
    match request_id::from_metadata(req.metadata()).map_err(Status::from)? {
        Some(_) => Ok(()),
        None => Err(Status::invalid_argument(format!(
            "{seqs} number the {what} under the call's client, but the call carries no {} \
             metadata",
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

/// The asks of [`Coordination::xla_alive_asks`], and the sets they ask about.
const XLA_ALIVE_ASKS: Items = Items::new("asks", "requesting_task_id", MAX_ARRIVALS);
const XLA_ALIVE_SETS: Items = Items::new("sets", "", MAX_ARRIVALS);

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

/// Records one of jaxlib's GetAliveTasks asks, the task and set it `named` (or the error reading
/// them ended with), under request id `id`; its answer: the round it joined.
async fn xla_alive_answer(
    core: &CoordCore,
    named: Result<(TaskName, TaskSet), CoordError>,
    id: Option<RequestId>,
) -> Result<pb::BarrierAnswer, CoordError> {
    let recorded = core.alive_arrival(id, named).await;
    let round = recorded
        .map(|(generation, finished)| (generation as i64, finished.then_some(Outcome::Passed)));
    arrival_outcome(round, 0, detailed)
}

/// Records each of `m`'s asks as the task's own GetAliveTasks call records it (see
/// [`XlaService::alive_named_with`]), each under its number in `ask_seqs` under the call's client
/// (`id`), each set read once for all the asks about it; their answers, in order.
async fn alive_asks_answered(
    core: &CoordCore,
    xla: &XlaService,
    m: pb::XlaAliveAsksRequest,
    id: Option<RequestId>,
) -> Result<pb::BarrierArrivalsResponse, CoordError> {
    // A set that is not the job's is read again for each ask's own error.
    let read: Vec<Option<TaskSet>> = (m.sets.iter())
        .map(|s| xla.alive_set(&s.task_ids).ok())
        .collect();
    let (sets, set_of, seqs) = (m.sets, m.set, m.ask_seqs);
    let recorded = m.asks.into_iter().enumerate().map(|(i, a)| {
        let own = id
            .zip(seqs.get(i))
            .map(|(id, &seq)| RequestId { seq, ..id });
        let k = set_of.get(i).map_or(usize::MAX, |&k| k as usize);
        let named = xla.alive_named_with(&a, || match (read.get(k), sets.get(k)) {
            (Some(Some(set)), _) => Ok(set.clone()),
            (_, Some(listed)) => xla.alive_set(&listed.task_ids),
            _ => Err(CoordError::InvalidArgument(format!(
                "set[{i}]: no set #{k}"
            ))),
        });
        xla_alive_answer(core, named, own)
    });
    all_answered(recorded).await
}

/// `XlaAliveArrivals`' arrivals as the asks of an `XlaAliveAsks` call: each arrival's list a set
/// of its own.
fn arrivals_as_asks(m: pb::XlaAliveArrivalsRequest) -> pb::XlaAliveAsksRequest {
    let n = m.arrivals.len() as u32;
    let (sets, asks) = (m.arrivals.into_iter())
        .map(|mut a| {
            let task_ids = std::mem::take(&mut a.task_ids);
            (pb::AliveSet { task_ids }, a)
        })
        .unzip();
    pb::XlaAliveAsksRequest {
        sets,
        asks,
        set: (0..n).collect(),
        ask_seqs: m.arrival_seqs,
    }
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

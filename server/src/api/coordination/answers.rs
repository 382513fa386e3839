//! How `coord.coordination.Coordination`'s calls carrying several tasks' items are read and
//! answered: each item checked and recorded as the task's own call would be, and answered with
//! that call's outcome or error (code, message and payloads) among the others'.

use coord_proto::coord::coordination as pb;
use coord_proto::tensorflow as tf;
use coord_proto::xla::coordination as xla;
use coord_raft_store::state::{Outcome, TaskName, TaskSet};
use coord_raft_store::RequestId;
use tonic::{Request, Status};

use crate::api::numbered::{error_fields, item_answer, item_id, numbered};
use crate::api::payloads::{barrier_error, detailed_with};
use crate::api::tf::{devices_of, heartbeat_answer};
use crate::api::wire::{task_from, tasks_from};
use crate::api::xla::errors::detailed;
use crate::api::xla::XlaService;
use crate::error::CoordError;
use crate::serve::coordination::CoordCore;

/// Checks that `XlaAliveArrivals` numbers its arrivals as it must (see [`numbered`]).
pub(super) fn arrivals_numbered(req: &Request<pb::XlaAliveArrivalsRequest>) -> Result<(), Status> {
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
pub(super) fn asks_well_formed(req: &Request<pb::XlaAliveAsksRequest>) -> Result<(), Status> {
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

/// One beat's answer as its own Heartbeat call would have had it; `Err` for an error the whole
/// call must end with, one that routing re-drives (the leader changed meanwhile).
pub(super) fn beat_answer(
    core: &CoordCore,
    i: usize,
    beat: &pb::Beat,
) -> Result<pb::BeatAnswer, CoordError> {
    let answered = task_from(beat.task.as_ref(), &format!("beats[{i}].task"))
        .and_then(|task| heartbeat_answer(core, &task, beat.incarnation));
    item_answer(
        answered.map_err(|e| detailed_with(e, None)),
        |leader_incarnation| pb::BeatAnswer {
            leader_incarnation,
            ..Default::default()
        },
        |error_code, error_message, details| pb::BeatAnswer {
            leader_incarnation: 0,
            error_code,
            error_message,
            error_details: details.into(),
        },
    )
}

/// What a task's Barrier call is answered with once its instance is decided (`Outcome`) or it
/// failed by itself (`Err`): TensorFlow's `BarrierError` names the barrier as the task called it.
/// `Err` from this function is an error the whole call must end with (the leader changed).
pub(super) fn barrier_answer(
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
pub(super) async fn wait_arrival_answer(
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
pub(super) async fn arrival_answer(
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
pub(super) async fn xla_arrival_answer(
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
pub(super) async fn alive_asks_answered(
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
        let own = item_id(id, &seqs, i);
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
pub(super) fn arrivals_as_asks(m: pb::XlaAliveArrivalsRequest) -> pb::XlaAliveAsksRequest {
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
pub(super) async fn all_answered<F>(
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

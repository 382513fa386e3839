//! Tasks leaving while the others wait to learn who is alive (`--stayers K`): the last K tasks
//! of the job ask GetAliveTasks of the whole job and park, then every other task calls
//! ShutdownTask, all at once, each its own call, as the processes of a job that is being taken
//! down or shrunk leave. The round waits for every connected task of the set, so it is answered
//! once the last leaver is gone; timed from the first ShutdownTask to the last stayer's answer.
//!
//! With `--history-barriers B`, B barrier ids have passed before (one task's each, as a job's
//! checkpoint steps leave theirs behind): a task that leaves fails the pending barriers it takes
//! part in, and must find those without a walk of every id the job ever used.
//!
//! Each leaver is one command that changes one task. What the state does after such a change
//! (the open round's count of whom it still waits for, whether the job still has a connected
//! task) must cost that change, not a walk of the job: N leavers would otherwise cost N² looks.

use std::time::{Duration, Instant};

use coord_proto::conn::EagerEnd;
use coord_proto::xla::coordination as xla;
use tonic::transport::Channel;

use super::super::tasks::{cpu_seconds, parked_until, Spawned};
use super::wire::{client, id, incarnations};

/// Barrier calls of the history in flight at once.
const HISTORY_IN_FLIGHT: usize = 2_000;

/// What the phase measured.
pub struct Leaving {
    pub leavers: usize,
    pub stayers: usize,
    /// Barrier ids passed before the phase.
    pub history_barriers: usize,
    /// From the first ShutdownTask sent to the last stayer's answer.
    pub answered: Duration,
    /// The leader's CPU over the same time.
    pub leader_cpu_seconds: f64,
}

/// Runs the phase on a job of `tasks` registered tasks of service incarnation `service`, task
/// `i` calling over `channel(i)`, after `history` barriers passed; `parked` counts the calls the
/// leader (pid `pid`) holds.
#[allow(clippy::too_many_arguments)]
pub(super) async fn leave_while_others_ask<'c>(
    channel: impl Fn(usize) -> &'c EagerEnd<Channel>,
    tasks: usize,
    stayers: usize,
    history: usize,
    service: u64,
    pid: u32,
    parked: impl Fn() -> u64,
) -> Result<Leaving, String> {
    let stayers = stayers.clamp(1, tasks);
    let leavers = tasks - stayers;
    pass_history(&channel, leavers..tasks, history, service).await?;
    let all: Vec<i32> = (0..tasks).map(id).collect();
    let ask = |i: usize| {
        let req = xla::GetAliveTasksRequest {
            incarnations: incarnations(i, service),
            requesting_task_id: id(i),
            task_ids: all.clone(),
        };
        let mut c = client(channel(i));
        Spawned::new(async move {
            let alive = c.get_alive_tasks(req).await?.into_inner().alive_task_ids;
            Ok::<_, tonic::Status>((Instant::now(), alive))
        })
    };
    let already = parked();
    let asking: Vec<_> = (leavers..tasks).map(ask).collect();
    let asking = parked_until(
        asking,
        &parked,
        already + stayers as u64,
        "GetAliveTasks of the stayers",
    )
    .await?;
    eprintln!("{stayers} GetAliveTasks calls parked; {leavers} tasks now leave");

    let cpu0 = cpu_seconds(pid).unwrap_or(0.0);
    let started = Instant::now();
    let leaving: Vec<_> = (0..leavers)
        .map(|i| {
            let req = xla::ShutdownTaskRequest {
                incarnations: incarnations(i, service),
                source_task_id: id(i),
            };
            let mut c = client(channel(i));
            Spawned::new(async move { c.shutdown_task(req).await.map(|_| ()) })
        })
        .collect();
    let mut last = started;
    let expected: Vec<i32> = (leavers..tasks).map(id).collect();
    for (k, call) in asking.into_iter().enumerate() {
        let (at, mut alive) = call
            .join()
            .await?
            .map_err(|e| format!("GetAliveTasks of task {}: {e}", leavers + k))?;
        alive.sort_unstable();
        if alive != expected {
            return Err(format!(
                "task {} was told {} tasks alive ({:?}...), not the {stayers} that stayed",
                leavers + k,
                alive.len(),
                &alive[..alive.len().min(5)]
            ));
        }
        last = last.max(at);
    }
    let leader_cpu_seconds = cpu_seconds(pid).unwrap_or(0.0) - cpu0;
    for (i, call) in leaving.into_iter().enumerate() {
        call.join()
            .await?
            .map_err(|e| format!("ShutdownTask of task {i}: {e}"))?;
    }
    let answered = last.duration_since(started);
    eprintln!(
        "{leavers} tasks left and the {stayers} that stayed were told so {answered:?} after the \
         first left (leader CPU {leader_cpu_seconds:.2} s)"
    );
    Ok(Leaving {
        leavers,
        stayers,
        history_barriers: history,
        answered,
        leader_cpu_seconds,
    })
}

/// `count` barrier ids passed, `history/<k>` by one of `by` alone (tasks that stay connected
/// through the phase: the others may have left already).
async fn pass_history<'c>(
    channel: &impl Fn(usize) -> &'c EagerEnd<Channel>,
    by: std::ops::Range<usize>,
    count: usize,
    service: u64,
) -> Result<(), String> {
    let started = Instant::now();
    for first in (0..count).step_by(HISTORY_IN_FLIGHT) {
        let calls: Vec<_> = (first..count.min(first + HISTORY_IN_FLIGHT))
            .map(|k| {
                let i = by.start + k % by.len();
                let req = xla::BarrierRequest {
                    incarnations: incarnations(i, service),
                    barrier_id: format!("history/{k}"),
                    barrier_timeout_in_ms: 60_000,
                    task_ids: vec![id(i)],
                    source_task_id: id(i),
                    counter: 0,
                };
                let mut c = client(channel(i));
                Spawned::new(async move { c.barrier(req).await.map(|_| ()) })
            })
            .collect();
        for (k, call) in (first..).zip(calls) {
            call.join()
                .await?
                .map_err(|e| format!("Barrier history/{k}: {e}"))?;
        }
    }
    if count > 0 {
        eprintln!("{count} barrier ids passed in {:?}", started.elapsed());
    }
    Ok(())
}

//! Tasks leaving while the others wait to learn who is alive (`--stayers K`): the last K tasks
//! of the job ask GetAliveTasks of the whole job and park, then every other task calls
//! ShutdownTask, all at once, each its own call, as the processes of a job that is being taken
//! down or shrunk leave. The round waits for every connected task of the set, so it is answered
//! once the last leaver is gone; timed from the first ShutdownTask to the last stayer's answer.
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

/// What the phase measured.
pub struct Leaving {
    pub leavers: usize,
    pub stayers: usize,
    /// From the first ShutdownTask sent to the last stayer's answer.
    pub answered: Duration,
    /// The leader's CPU over the same time.
    pub leader_cpu_seconds: f64,
}

/// Runs the phase on a job of `tasks` registered tasks of service incarnation `service`, task
/// `i` calling over `channel(i)`; `parked` counts the calls the leader (pid `pid`) holds.
pub(super) async fn leave_while_others_ask<'c>(
    channel: impl Fn(usize) -> &'c EagerEnd<Channel>,
    tasks: usize,
    stayers: usize,
    service: u64,
    pid: u32,
    parked: impl Fn() -> u64,
) -> Result<Leaving, String> {
    let stayers = stayers.clamp(1, tasks);
    let leavers = tasks - stayers;
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
        answered,
        leader_cpu_seconds,
    })
}

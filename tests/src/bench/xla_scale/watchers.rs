//! Every task watching the job's tasks (`--watchers`), as jaxlib's runtime-client thread
//! `global_process_info` does where it runs (a WatchTasks call kept open, each answer every
//! task's record): every task parks WatchTasks at the current version, then one task
//! leaves (ShutdownTask), which answers all of them with the job's N records. Timed from the
//! ShutdownTask to the last watcher's answer, first with each task's own call (N answers of N
//! records from the replica they call), then through a sidecar per connection (coord-proxy's
//! `XlaProxy`, in this process: one call to the ensemble per sidecar and version, shared by its
//! tasks).
//!
//! A change answers N watchers with the same N records: built and encoded for each of them,
//! that is N² work on the leader per change, in the replica that also holds the term.
//!
//! Every watcher gets N records however the calls go (N² in all: jaxlib's protocol), and this
//! process carries every task and every sidecar, whose answer each of its tasks gets a copy of:
//! so the phase runs only up to `--watch-max` tasks.

use std::time::{Duration, Instant};

use coord_agent::proxy::xla::XlaProxy;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::conn::EagerEnd;
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_server::CoordinationService;
use tonic::transport::Channel;

use super::super::tasks::{call_size, cpu_seconds, parked_until, Spawned};
use super::wire::{client, id, incarnations};

/// jaxlib's WatchTasks, for the calls whose answers are only counted.
const WATCH_TASKS: &str = "/xla.coordination.CoordinationService/WatchTasks";

/// One change answered to every watcher.
pub struct WatchRound {
    /// From the ShutdownTask to the last watcher's answer.
    pub answered: Duration,
    /// The leader's CPU over the same time.
    pub leader_cpu_seconds: f64,
    /// Answers the replica the calls went to gzip-compressed meanwhile (own calls only).
    pub compressions: Option<u64>,
    /// One answer's bytes as it crossed the wire (own calls: the mean over the watchers).
    pub answer_bytes: u64,
    /// Through sidecars: from the ShutdownTask until every sidecar had answered its first task
    /// (the ensemble's part; the rest is the sidecars copying the answer to each of their tasks,
    /// all of them in this one process here).
    pub every_sidecar_first: Option<Duration>,
}

/// What the phase measured.
pub struct Watching {
    pub watchers: usize,
    /// Each task's own call.
    pub own: WatchRound,
    pub through_sidecars: WatchRound,
}

/// Where the phase sends its calls: task `i` over `channel(i)`, the sidecars to `endpoints`;
/// `parked` counts the calls the leader (pid `pid`) holds, `compressions` the answers the called
/// replica compressed.
pub(super) struct Job<'c, C, P, Z> {
    pub channel: C,
    pub endpoints: &'c [String],
    pub connections: usize,
    pub tasks: usize,
    pub service: u64,
    pub pid: u32,
    pub parked: P,
    pub compressions: Z,
}

/// Runs the phase: task 0 leaves for the round of own calls, task 1 for the round through the
/// sidecars (the job needs 2 tasks).
pub(super) async fn watch_changes<'c, C, P, Z>(job: Job<'c, C, P, Z>) -> Result<Watching, String>
where
    C: Fn(usize) -> &'c EagerEnd<Channel>,
    P: Fn() -> u64,
    Z: Fn() -> u64,
{
    if job.tasks < 2 {
        return Err("the watchers' phase needs 2 tasks".into());
    }
    let own = own_round(&job).await?;
    let through_sidecars = sidecar_round(&job).await?;
    Ok(Watching {
        watchers: job.tasks,
        own,
        through_sidecars,
    })
}

/// The job's current task version, and its answer checked: every task listed.
async fn version<'c, C, P, Z>(job: &Job<'c, C, P, Z>) -> Result<(i64, usize), String>
where
    C: Fn(usize) -> &'c EagerEnd<Channel>,
{
    let i = job.tasks - 1;
    let answer = client((job.channel)(i))
        .watch_tasks(xla::WatchTasksRequest {
            incarnations: incarnations(i, job.service),
            version_number: -1,
        })
        .await
        .map_err(|e| format!("WatchTasks of task {i}: {e}"))?
        .into_inner();
    if answer.task_state.len() != job.tasks {
        return Err(format!(
            "WatchTasks listed {} of {} tasks",
            answer.task_state.len(),
            job.tasks
        ));
    }
    Ok((answer.version_number, prost::Message::encoded_len(&answer)))
}

/// Task `i` leaves: the change every watcher is answered by.
async fn leave<'c, C, P, Z>(job: &Job<'c, C, P, Z>, i: usize) -> Result<(), String>
where
    C: Fn(usize) -> &'c EagerEnd<Channel>,
{
    client((job.channel)(i))
        .shutdown_task(xla::ShutdownTaskRequest {
            incarnations: incarnations(i, job.service),
            source_task_id: id(i),
        })
        .await
        .map(|_| ())
        .map_err(|e| format!("ShutdownTask of task {i}: {e}"))
}

/// Every task's own WatchTasks at the current version, answered by task 0 leaving.
async fn own_round<'c, C, P, Z>(job: &Job<'c, C, P, Z>) -> Result<WatchRound, String>
where
    C: Fn(usize) -> &'c EagerEnd<Channel>,
    P: Fn() -> u64,
    Z: Fn() -> u64,
{
    let (version, _) = version(job).await?;
    let watch = |i: usize| {
        let req = tonic::Request::new(xla::WatchTasksRequest {
            incarnations: incarnations(i, job.service),
            version_number: version,
        });
        let ch = (job.channel)(i).clone();
        Spawned::new(async move {
            let bytes = call_size(ch, WATCH_TASKS, req).await?.into_inner();
            Ok::<_, tonic::Status>((Instant::now(), bytes as u64))
        })
    };
    let already = (job.parked)();
    let watching: Vec<_> = (0..job.tasks).map(watch).collect();
    let watching = parked_until(
        watching,
        &job.parked,
        already + job.tasks as u64,
        "WatchTasks",
    )
    .await?;
    eprintln!("{} WatchTasks calls parked; task 0 leaves", job.tasks);
    let (cpu0, compressions0) = (cpu_seconds(job.pid).unwrap_or(0.0), (job.compressions)());
    let started = Instant::now();
    leave(job, 0).await?;
    let mut last = started;
    let mut bytes = 0;
    for (i, call) in watching.into_iter().enumerate() {
        let (at, b) = call
            .join()
            .await?
            .map_err(|e| format!("WatchTasks of task {i}: {e}"))?;
        last = last.max(at);
        bytes += b;
    }
    let round = WatchRound {
        answered: last.duration_since(started),
        leader_cpu_seconds: cpu_seconds(job.pid).unwrap_or(0.0) - cpu0,
        compressions: Some((job.compressions)().saturating_sub(compressions0)),
        answer_bytes: bytes / job.tasks as u64,
        every_sidecar_first: None,
    };
    eprintln!(
        "{} watchers answered {:?} after task 0 left (leader CPU {:.2} s, {} B an answer)",
        job.tasks, round.answered, round.leader_cpu_seconds, round.answer_bytes
    );
    Ok(round)
}

/// Every task's WatchTasks through its connection's sidecar, answered by task 1 leaving; each
/// answer must be the new version, with task 1 disconnected.
async fn sidecar_round<'c, C, P, Z>(job: &Job<'c, C, P, Z>) -> Result<WatchRound, String>
where
    C: Fn(usize) -> &'c EagerEnd<Channel>,
    P: Fn() -> u64,
{
    let (version, answer_bytes) = version(job).await?;
    let mut sidecars = Vec::with_capacity(job.connections);
    for _ in 0..job.connections.max(1) {
        let client = CoordClient::new(ClientOptions::new(job.endpoints.to_vec()))
            .map_err(|e| format!("a sidecar's client: {e}"))?;
        client
            .find_leader()
            .await
            .ok_or("a sidecar found no leader")?;
        sidecars.push(std::sync::Arc::new(XlaProxy::new(client)));
    }
    let per_sidecar = job.tasks.div_ceil(sidecars.len());
    let watch = |i: usize| {
        let proxy = sidecars[i / per_sidecar].clone();
        let req = tonic::Request::new(xla::WatchTasksRequest {
            incarnations: incarnations(i, job.service),
            version_number: version,
        });
        Spawned::new(async move {
            let answer = proxy.watch_tasks(req).await?.into_inner();
            Ok::<_, tonic::Status>((Instant::now(), answer))
        })
    };
    let already = (job.parked)();
    let watching: Vec<_> = (0..job.tasks).map(watch).collect();
    // One call per sidecar parks on the leader; its other tasks' reads wait in the sidecar.
    let watching = parked_until(
        watching,
        &job.parked,
        already + sidecars.len() as u64,
        "WatchTasks through a sidecar",
    )
    .await?;
    eprintln!(
        "{} sidecars' WatchTasks calls parked for {} tasks; task 1 leaves",
        sidecars.len(),
        job.tasks
    );
    let cpu0 = cpu_seconds(job.pid).unwrap_or(0.0);
    let started = Instant::now();
    leave(job, 1).await?;
    let mut last = started;
    let mut firsts = vec![None::<Instant>; sidecars.len()];
    for (i, call) in watching.into_iter().enumerate() {
        let (at, answer) = call
            .join()
            .await?
            .map_err(|e| format!("WatchTasks of task {i} through its sidecar: {e}"))?;
        let left = answer.task_state.iter().find(|t| t.task_id == 1);
        if answer.version_number <= version
            || answer.task_state.len() != job.tasks
            || left.map(|t| t.state) != Some(xla::TaskState::TaskstateDisconnected as i32)
        {
            return Err(format!(
                "task {i} was told version {} of {} tasks (task 1: {left:?}), after version \
                 {version} and task 1 leaving",
                answer.version_number,
                answer.task_state.len()
            ));
        }
        last = last.max(at);
        let first = &mut firsts[i / per_sidecar];
        *first = Some(first.map_or(at, |f| f.min(at)));
    }
    let round = WatchRound {
        answered: last.duration_since(started),
        leader_cpu_seconds: cpu_seconds(job.pid).unwrap_or(0.0) - cpu0,
        compressions: None,
        answer_bytes: answer_bytes as u64,
        every_sidecar_first: firsts.into_iter().flatten().max().map(|f| f - started),
    };
    eprintln!(
        "{} watchers through {} sidecars answered {:?} after task 1 left, each sidecar's first \
         by {:?} (leader CPU {:.2} s)",
        job.tasks,
        sidecars.len(),
        round.answered,
        round.every_sidecar_first,
        round.leader_cpu_seconds
    );
    Ok(round)
}

//! `coord-bench xla-scale`: a large JAX job on jaxlib's own wire
//! (`xla.coordination.CoordinationService`), for each size N on a fresh three-replica ensemble
//! (`--job jax_worker=N`, the XLA job). The same job as [`super::scale`]'s, minus what jaxlib does
//! not do, plus what it does differently:
//!
//! - the tasks call the leader's address straight, over plain gRPC connections a hundred tasks
//!   share: jaxlib's client has no failover (a sidecar gives it one; this bench measures the
//!   leader without);
//! - RegisterTask waits at the register barrier, so all N calls are in flight at once and the
//!   storm is timed from the first call to the last answer;
//! - GetAliveTasks (what jax's `live_devices` calls) names all N tasks and is barrier-like: it
//!   returns once every task asked.
//!
//! Besides time, CPU and memory, it reads how much Raft log each phase wrote (entries, and the
//! leader's data directory on disk): commands that listed every task of the job in each call
//! would write O(N²) bytes of log in a phase of N calls (the XLA registration and GetAliveTasks
//! did, before they committed task sets as runs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_proto::conn::EagerEnd;
use coord_proto::xla::coordination as xla;
use tonic::transport::Channel;

use super::raft_log::{log_cell, log_record_bytes, LogMark};
use super::tasks::{
    call_size, cpu_seconds, metric, parked_calls, parked_until, rss_bytes, Spawned, ACCEPT_GZIP,
};
use super::{disk_usage, mb};

mod calls;
mod leavers;
mod phase;
mod report;
mod watchers;
mod wire;

use calls::{heartbeat, register};
pub use leavers::Leaving;
use phase::{within, PHASE_LIMIT};
use report::print;
pub use report::{Measured, OwnAlive};
pub use watchers::{WatchRound, Watching};
use wire::{client, id, incarnations};

/// What `coord-bench xla-scale` runs.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Job sizes, in tasks, each on a fresh ensemble.
    #[arg(long, value_delimiter = ',', default_values_t = [2_000, 10_000])]
    pub sizes: Vec<usize>,
    /// Tasks per gRPC connection, as a host's processes behind one address would share it.
    #[arg(long, default_value_t = 100)]
    pub tasks_per_connection: usize,
    /// Each task heartbeats this often, in ms. jaxlib's agent heartbeats every half of its
    /// heartbeat timeout, and `jax.distributed.initialize` sets 100 s: one every 50 s. The
    /// default is TensorFlow's 5 s (what `scale` runs), ten times jaxlib's load.
    #[arg(long, default_value_t = 5_000)]
    pub heartbeat_ms: u64,
    /// The tasks neither compress requests nor accept gzip answers (jaxlib, as JAX starts it
    /// with `use_compression=True`, does both).
    #[arg(long)]
    pub no_gzip: bool,
    /// Leader CPU is read over this long, in ms, with the tasks only heartbeating.
    #[arg(long, default_value_t = 15_000)]
    pub cpu_window_ms: u64,
    /// Jobs larger than this make no round of each task's own GetAliveTasks call, only the
    /// round through sidecars: every own call lists the whole job, so a round of N of them is N²
    /// task ids in the requests (100,000 tasks: some 30 GB, which this process cannot hold).
    #[arg(long, default_value_t = 30_000)]
    pub own_alive_max: usize,
    /// The tasks' own calls go to a follower, which relays each to the leader, as jaxlib's do
    /// when the address it was given is a replica that does not lead (or no longer does, after
    /// a failover). The sidecars' rounds still go to the leader, as coord-proxy finds it.
    #[arg(long)]
    pub via_follower: bool,
    /// Then every task watches the job's tasks (WatchTasks, as jaxlib's runtime client keeps
    /// it open) while one task leaves, first with each task's own call, then through a sidecar
    /// per connection (tasks 0 and 1 leave).
    #[arg(long)]
    pub watchers: bool,
    /// Jobs larger than this skip the watchers' phase: every watcher's answer is the whole job
    /// (N² records in all), and this process would hold every task's copy.
    #[arg(long, default_value_t = 10_000)]
    pub watch_max: usize,
    /// Last, the other tasks leave (ShutdownTask, all at once) while these many wait in a
    /// GetAliveTasks round of the whole job, which they are answered once the last has left
    /// (0: no such phase; it ends the job).
    #[arg(long, default_value_t = 0)]
    pub stayers: usize,
    /// Before that phase, this many barrier ids pass, each one task's (a job's history: a
    /// barrier per checkpoint step); the leavers fail the pending barriers they take part in.
    #[arg(long, default_value_t = 0)]
    pub history_barriers: usize,
    /// Extra flags for every coord replica (e.g. --coord-arg=--election-timeout-max-ms=3000).
    #[arg(long = "coord-arg")]
    pub coord_args: Vec<String>,
}

/// The job coord serves to XLA clients: jaxlib's XLA wire names tasks by number only, and
/// `jax_worker` is the job name jaxlib used on TensorFlow's wire.
const JOB: &str = "jax_worker";

/// The heartbeat timeout `jax.distributed.initialize` configures (its agents heartbeat every
/// half of it).
const JAX_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(100);

/// GetAliveTasks, for the calls whose answers are only counted (see [`call_size`]).
const GET_ALIVE_TASKS: &str = "/xla.coordination.CoordinationService/GetAliveTasks";

/// Runs `coord-bench xla-scale`; a size that fails is reported and the next one still runs.
pub async fn run(args: Args) -> Result<(), String> {
    ACCEPT_GZIP.store(!args.no_gzip, Ordering::Relaxed);
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for &tasks in &args.sizes {
        match measure(&args, tasks).await {
            Ok(m) => done.push(m),
            Err(e) => {
                eprintln!("coord-bench xla-scale: {tasks} tasks failed: {e}");
                failed.push(format!("{tasks} tasks: {e}"));
            }
        }
    }
    print(&done, args.no_gzip);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// One size on a fresh ensemble.
pub async fn measure(args: &Args, tasks: usize) -> Result<Measured, String> {
    let tasks = tasks.max(1);
    let heartbeat_every = Duration::from_millis(args.heartbeat_ms.max(1));
    // JAX's: `jax.distributed.initialize` gives the service a 100 s heartbeat timeout.
    let heartbeat_timeout = (heartbeat_every * 2).max(JAX_HEARTBEAT_TIMEOUT);
    let mut cluster = crate::Cluster::start(crate::ClusterOptions {
        extra_args: vec![
            "--worker-threads".into(),
            "1".into(),
            "--job".into(),
            format!("{JOB}={tasks}"),
            "--xla-job".into(),
            JOB.into(),
            "--heartbeat-timeout-ms".into(),
            heartbeat_timeout.as_millis().to_string(),
        ]
        .into_iter()
        .chain(args.coord_args.iter().cloned())
        .collect(),
        log_filter: "warn".into(),
        ..crate::ClusterOptions::default()
    });
    // The job starts once its service is up: after the ensemble's own first writes.
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let pid = cluster.pid(leader).ok_or("leader has no process")?;
    let term_before = cluster.status(leader).ok_or("leader has no /status")?.term;
    // A leader change fails the size at once: the tasks have no failover, and calls parked on a
    // leader that lost its term would otherwise be waited for until the phase limit.
    let still_leading = || match cluster.status(leader) {
        Some(s) if s.term != term_before || s.leader_id != Some(leader) => Err(format!(
            "the leader changed (term {term_before} -> {}, leader now {:?})",
            s.term, s.leader_id
        )),
        _ => Ok(()),
    };
    let replica = cluster.replica(leader);
    let (http, data_dir) = (replica.http, replica.data_dir.clone());
    // The replica the tasks call, and its process (the leader's, or the follower's that relays).
    let called = if args.via_follower {
        cluster.other_than(leader)
    } else {
        leader
    };
    let (grpc, called_pid) = (
        cluster.replica(called).grpc,
        cluster
            .pid(called)
            .ok_or("the called replica has no process")?,
    );
    let mark = || -> Result<LogMark, String> {
        let s = cluster.status(leader).ok_or("leader has no /status")?;
        Ok(LogMark {
            last_index: s.last_log_index,
            snapshot_index: s.snapshot_index,
            records: log_record_bytes(&data_dir),
            disk: disk_usage(&data_dir),
        })
    };
    // A phase that fails says how far it got: what it had written to the log by then.
    let wrote = |e: String, since: LogMark, t: Instant| match mark() {
        Ok(now) => format!(
            "{e} ({:.1?} in; the log grew meanwhile by {})",
            t.elapsed(),
            log_cell(&since.to(now), None)
        ),
        Err(_) => e,
    };
    // Calls the leader holds parked (only the leader parks any), and the GetAliveTasks calls a
    // follower the tasks call holds while their rounds finish (it waits on each round on the
    // leader once, for all of them).
    let called_http = cluster.replica(called).http;
    let parked = move || {
        let relayed = if called == leader {
            0
        } else {
            metric(called_http, "coord_relayed_waiting_calls").map_or(0, |n| n as u64)
        };
        parked_calls(http) + relayed
    };

    let connections = tasks.div_ceil(args.tasks_per_connection.max(1));
    let mut channels = Vec::with_capacity(connections);
    for _ in 0..connections {
        let ch = Channel::from_shared(format!("http://{grpc}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("connect to replica {called} at {grpc}: {e}"))?;
        channels.push(EagerEnd(ch));
    }
    let channel = |i: usize| &channels[i % channels.len()];
    eprintln!(
        "coord-bench xla-scale: {tasks} tasks over {connections} connections to replica {called} \
         (the leader is replica {leader}, pid {pid}), heartbeat every {heartbeat_every:?}"
    );

    // Registration storm: every task's RegisterTask at once, as the job's processes start.
    let leader_rss_before = rss_bytes(pid).unwrap_or(0);
    let before_register = mark()?;
    let started = Instant::now();
    let register_retries = Arc::new(AtomicU64::new(0));
    let registering: Vec<_> = (0..tasks)
        .map(|i| Spawned::new(register(client(channel(i)), i, register_retries.clone())))
        .collect();
    let service = within("RegisterTask", &still_leading, async {
        let mut service = None;
        for (i, call) in registering.into_iter().enumerate() {
            let got = call
                .join()
                .await?
                .map_err(|e| format!("RegisterTask of task {i}: {e}"))?;
            if *service.get_or_insert(got) != got || got == 0 {
                return Err(format!(
                    "task {i} got service incarnation {got}, others {service:?}"
                ));
            }
        }
        service.ok_or_else(|| "no task registered".to_string())
    })
    .await
    .map_err(|e| wrote(e, before_register, started))?;
    let register = started.elapsed();
    let after_register = mark()?;
    eprintln!("registered {tasks} tasks in {register:?}");

    // Every task heartbeats from its answer on, as jaxlib's agent does once connected, spread
    // over the interval as independent processes' heartbeats are.
    let heartbeat_errors = Arc::new(AtomicU64::new(0));
    let beats: Vec<Spawned<()>> = (0..tasks)
        .map(|i| {
            let first = heartbeat_every.mul_f64(i as f64 / tasks as f64);
            heartbeat(
                client(channel(i)),
                i,
                service,
                first,
                heartbeat_every,
                heartbeat_errors.clone(),
            )
        })
        .collect();
    // One whole interval first, so that every task is beating when the window opens.
    let cpu_window = Duration::from_millis(args.cpu_window_ms);
    let settle = Duration::from_secs(2);
    tokio::time::sleep(heartbeat_every.clamp(settle, cpu_window.max(settle))).await;
    let before_heartbeats = mark()?;
    let cpu0 = cpu_seconds(pid).unwrap_or(0.0);
    let t0 = Instant::now();
    tokio::time::sleep(cpu_window).await;
    let heartbeat_cpu_cores = (cpu_seconds(pid).unwrap_or(0.0) - cpu0) / t0.elapsed().as_secs_f64();
    let heartbeat_log = before_heartbeats.to(mark()?);
    let leader_rss_registered = rss_bytes(pid).unwrap_or(0);
    eprintln!("heartbeats only: leader uses {heartbeat_cpu_cores:.2} cores");

    // GetAliveTasks of the whole job by every task: all but one park, then the last asks and
    // is timed until every task has its answer. Task 0 decodes its answer (to check that it
    // lists the whole job alive); the others only count theirs.
    let all: Arc<Vec<i32>> = Arc::new((0..tasks).map(id).collect());
    let mut leader_rss_parked = 0;
    let own_alive = if tasks <= args.own_alive_max {
        let request = |i: usize| xla::GetAliveTasksRequest {
            incarnations: incarnations(i, service),
            requesting_task_id: id(i),
            task_ids: all.as_ref().clone(),
        };
        let ask = |i: usize| {
            let req = request(i);
            let ch = channel(i).clone();
            Spawned::new(async move {
                if i == 0 {
                    let answer = client(&ch).get_alive_tasks(req).await?.into_inner();
                    let size = prost::Message::encoded_len(&answer);
                    Ok::<_, tonic::Status>((
                        Instant::now(),
                        0,
                        Some((answer.alive_task_ids.len(), size)),
                    ))
                } else {
                    let bytes = call_size(ch, GET_ALIVE_TASKS, tonic::Request::new(req)).await?;
                    Ok((Instant::now(), bytes.into_inner() as u64, None))
                }
            })
        };
        let counted = |name| metric(called_http, name).map_or(0, |n| n as u64);
        let compressions = || counted("coord_answer_compressions_total");
        let round_waits = || counted("coord_relayed_waits_total");
        let (called_cpu0, compressions0) = (cpu_seconds(called_pid).unwrap_or(0.0), compressions());
        let round_waits0 = round_waits();
        let asked = || {
            (
                counted("coord_relayed_asks_total"),
                counted("coord_relayed_ask_calls_total"),
            )
        };
        let asked0 = asked();
        let before_alive = mark()?;
        let alive_started = Instant::now();
        let already_parked = parked();
        let early: Vec<_> = (0..tasks - 1).map(ask).collect();
        let early = within(
            "GetAliveTasks (the first N-1 parking)",
            &still_leading,
            parked_until(
                early,
                &parked,
                already_parked + (tasks - 1) as u64,
                "GetAliveTasks",
            ),
        )
        .await
        .map_err(|e| wrote(e, before_alive, alive_started))?;
        leader_rss_parked = rss_bytes(pid).unwrap_or(0);
        eprintln!(
            "{} GetAliveTasks calls parked: leader RSS {} MiB",
            tasks - 1,
            leader_rss_parked >> 20
        );
        let last_call = Instant::now();
        let (alive_wire_bytes, decoded, answered) =
            within("GetAliveTasks", &still_leading, async {
                let mut bytes = 0;
                let mut decoded = None;
                let mut answered = last_call;
                for (i, call) in early.into_iter().chain([ask(tasks - 1)]).enumerate() {
                    let (at, b, d) = call
                        .join()
                        .await?
                        .map_err(|e| format!("GetAliveTasks of task {i}: {e}"))?;
                    bytes += b;
                    decoded = decoded.or(d);
                    answered = answered.max(at);
                }
                Ok((bytes, decoded, answered))
            })
            .await
            .map_err(|e| wrote(e, before_alive, alive_started))?;
        let alive = answered.duration_since(last_call);
        let called_cpu_seconds = cpu_seconds(called_pid).unwrap_or(0.0) - called_cpu0;
        let called_compressions = compressions().saturating_sub(compressions0);
        let called_round_waits = round_waits().saturating_sub(round_waits0);
        let (called_asks, called_ask_calls) = {
            let (asks, calls) = asked();
            (
                asks.saturating_sub(asked0.0),
                calls.saturating_sub(asked0.1),
            )
        };
        let alive_log = before_alive.to(mark()?);
        let (alive_listed, alive_answer_bytes) = decoded.ok_or("task 0 got no answer")?;
        if alive_listed != tasks {
            return Err(format!(
                "GetAliveTasks listed {alive_listed} of {tasks} tasks alive"
            ));
        }
        eprintln!(
            "GetAliveTasks answered every task {alive:?} after the last call ({})",
            mb(alive_wire_bytes)
        );
        Some(OwnAlive {
            alive,
            alive_wire_bytes,
            alive_listed,
            alive_answer_bytes,
            alive_log,
            called_cpu_seconds,
            called_compressions,
            called_round_waits,
            called_asks,
            called_ask_calls,
        })
    } else {
        eprintln!(
            "no round of each task's own GetAliveTasks call above {} tasks (--own-alive-max)",
            args.own_alive_max
        );
        None
    };
    // An XLA Barrier of the whole job (jax's `sync_global_devices`), each task's own call: all
    // but the last park, the last is timed until every task passed. It comes before the rounds
    // through the sidecars, so that without an own GetAliveTasks round its parked calls are read
    // over heartbeating alone (memory a round freed is kept by the allocator and reused). The
    // same barrier again through the sidecars after their GetAliveTasks round.
    let arrival = |i: usize, barrier_id: &str| xla::BarrierRequest {
        incarnations: incarnations(i, service),
        barrier_id: barrier_id.to_string(),
        barrier_timeout_in_ms: PHASE_LIMIT.as_millis() as i64,
        task_ids: Vec::new(),
        source_task_id: id(i),
        counter: 0,
    };
    let arrive = |i: usize| {
        let (mut c, req) = (client(channel(i)), arrival(i, "xla-scale/own"));
        Spawned::new(async move { c.barrier(req).await.map(|_| Instant::now()) })
    };
    let leader_rss_before_barrier = rss_bytes(pid).unwrap_or(0);
    eprintln!(
        "before the Barrier: leader RSS {} MiB",
        leader_rss_before_barrier >> 20
    );
    let already_parked = parked();
    let early: Vec<_> = (0..tasks - 1).map(arrive).collect();
    let early = within(
        "Barrier (the first N-1 parking)",
        &still_leading,
        parked_until(
            early,
            &parked,
            already_parked + (tasks - 1) as u64,
            "Barrier",
        ),
    )
    .await?;
    let leader_rss_barrier_parked = rss_bytes(pid).unwrap_or(0);
    eprintln!(
        "{} Barrier calls parked: leader RSS {} MiB",
        tasks - 1,
        leader_rss_barrier_parked >> 20
    );
    let last_arrival = Instant::now();
    let released = within("Barrier", &still_leading, async {
        let mut released = last_arrival;
        for (i, call) in early.into_iter().chain([arrive(tasks - 1)]).enumerate() {
            let at = call
                .join()
                .await?
                .map_err(|e| format!("Barrier of task {i}: {e}"))?;
            released = released.max(at);
        }
        Ok(released)
    })
    .await?;
    let barrier = released.duration_since(last_arrival);
    eprintln!("Barrier passed every task {barrier:?} after the last arrival");

    // The next round, each connection's tasks carried by a sidecar.
    let endpoints = cluster.endpoints();
    let through = within(
        "GetAliveTasks through sidecars",
        &still_leading,
        super::xla_sidecars::alive_round(
            &endpoints,
            connections,
            tasks,
            all.to_vec(),
            |i| (incarnations(i, service), id(i)),
            &parked,
        ),
    )
    .await?;
    eprintln!(
        "GetAliveTasks through sidecars answered every task {:?} after the last ask (the \
         sidecars had it after {:?} to {:?})",
        through.answered, through.first_sidecar_had_it, through.sidecars_had_it
    );

    let barrier_through_sidecars = within(
        "Barrier through sidecars",
        &still_leading,
        super::xla_sidecars::barrier_round(
            &endpoints,
            connections,
            tasks,
            |i| arrival(i, "xla-scale/sidecars"),
            &parked,
        ),
    )
    .await?;
    eprintln!(
        "Barrier through sidecars passed every task {:?} after the last arrival",
        barrier_through_sidecars.answered
    );
    drop(beats);
    still_leading()?;
    if args.watchers && tasks > args.watch_max {
        eprintln!(
            "no watchers' phase above {} tasks (--watch-max)",
            args.watch_max
        );
    }
    let watching = if args.watchers && tasks <= args.watch_max {
        let called_http = cluster.replica(called).http;
        Some(
            within(
                "every task watching while tasks leave",
                &still_leading,
                watchers::watch_changes(watchers::Job {
                    channel,
                    endpoints: &endpoints,
                    connections,
                    tasks,
                    service,
                    pid,
                    parked: &parked,
                    compressions: || {
                        metric(called_http, "coord_answer_compressions_total")
                            .map_or(0, |n| n as u64)
                    },
                }),
            )
            .await?,
        )
    } else {
        None
    };
    let leaving = match args.stayers {
        0 => None,
        stayers => Some(
            within(
                "tasks leaving while others ask who is alive",
                &still_leading,
                leavers::leave_while_others_ask(
                    channel,
                    tasks,
                    stayers,
                    args.history_barriers,
                    service,
                    pid,
                    &parked,
                ),
            )
            .await?,
        ),
    };
    let after = cluster.status(leader).ok_or("leader has no /status")?;
    Ok(Measured {
        tasks,
        called: if args.via_follower {
            "a follower (relaying)"
        } else {
            "the leader"
        },
        connections,
        heartbeat_every,
        register,
        register_retries: register_retries.load(Ordering::Relaxed),
        register_log: before_register.to(after_register),
        heartbeat_cpu_cores,
        heartbeat_log,
        heartbeat_errors: heartbeat_errors.load(Ordering::Relaxed),
        own_alive,
        through_sidecars: through,
        barrier,
        barrier_through_sidecars,
        watching,
        leaving,
        leader_rss_before,
        leader_rss_registered,
        leader_rss_parked,
        leader_rss_before_barrier,
        leader_rss_barrier_parked,
        leader_rss_after: rss_bytes(pid).unwrap_or(0),
        elections: after.term - term_before,
    })
}

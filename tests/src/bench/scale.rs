//! `coord-bench scale` and `coord-bench tasks`: the job of [`super::tasks`] on a fresh
//! three-replica ensemble (`--job worker=N`) for each size N, one table with a column per size.
//! `tasks` is one size with the older defaults (heartbeat every second, 100 connections).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::tasks::{run, summed, Load, TasksReport, ACCEPT_GZIP};

/// What `coord-bench tasks` runs: one size.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Simulated tasks.
    #[arg(long, default_value_t = 10_000)]
    pub tasks: usize,
    /// Connections the tasks share (a real job has one per task, or one per sidecar).
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// Bytes of the one TensorFlow device each task sends with WaitForAllTasks (a CPU device's
    /// `DeviceAttributes` is about 170; 0 = no devices).
    #[arg(long, default_value_t = 170)]
    pub device_bytes: usize,
    /// The tasks do not accept gzip answers (TensorFlow's and jaxlib's clients do).
    #[arg(long)]
    pub no_gzip: bool,
    /// Each task heartbeats this often, in ms.
    #[arg(long, default_value_t = 1_000)]
    pub heartbeat_ms: u64,
    /// Barrier and WaitForAllTasks calls started per second as the tasks gather (0: all at once).
    #[arg(long, default_value_t = 0)]
    pub arrivals_per_second: usize,
}

/// How the simulated tasks of a job are carried and what they send: the flags `scale` and
/// `wait-for-all` share.
#[derive(clap::Args, Clone, Debug)]
pub struct JobShape {
    /// Tasks per connection, as a sidecar carrying a host's tasks would multiplex them.
    #[arg(long, default_value_t = 100)]
    pub tasks_per_connection: usize,
    /// Bytes of each task's one TensorFlow device (a CPU device's `DeviceAttributes` is about
    /// 170; 0 = no devices).
    #[arg(long, default_value_t = 170)]
    pub device_bytes: usize,
    /// The tasks do not offer gzip (TensorFlow's and jaxlib's gRPC clients do).
    #[arg(long)]
    pub no_gzip: bool,
}

/// What `coord-bench scale` runs: several sizes, TensorFlow's heartbeat interval.
#[derive(clap::Args, Clone, Debug)]
pub struct ScaleArgs {
    /// Job sizes, in tasks, each on a fresh ensemble.
    #[arg(long, value_delimiter = ',', default_values_t = [10_000, 30_000, 100_000])]
    pub sizes: Vec<usize>,
    #[command(flatten)]
    pub job: JobShape,
    /// Each task heartbeats this often, in ms: TensorFlow's agents send one every 5 s (half
    /// their 10 s timeout, which the ensemble is given too).
    #[arg(long, default_value_t = 5_000)]
    pub heartbeat_ms: u64,
    /// Barrier and WaitForAllTasks calls started per second as the tasks gather (0: all at
    /// once): a job's tasks reach a barrier over seconds, and 100,000 at once on this two-core
    /// machine (three replicas and the load generator) starve the heartbeats sent meanwhile.
    #[arg(long, default_value_t = 10_000)]
    pub arrivals_per_second: usize,
    /// Each simulated sidecar holds its tasks' heartbeats up to this long (ms) and sends them as
    /// one call, as coord-proxy does (`--heartbeat-batch-ms`); 0: every task's heartbeat is its
    /// own call of TensorFlow's wire, as a task talking to the ensemble directly sends it.
    #[arg(long, default_value_t = 0)]
    pub heartbeat_batch_ms: u64,
    /// Each simulated sidecar records its tasks' Barrier and WaitForAllTasks arrivals together and
    /// waits with one call (fetching the job's devices once), as coord-proxy does; without it
    /// every task's call parks on the leader, as a task talking to the ensemble directly sends it.
    #[arg(long)]
    pub arrivals_together: bool,
}

/// One size's run: the report and the elections it saw (the kill's only, if all went well).
struct Measured {
    report: TasksReport,
    connections: usize,
    elections: u64,
    /// The leader's `coord_replica_stalled_seconds_total` just before its kill.
    stalled: f64,
}

/// Runs `coord-bench tasks`.
pub async fn tasks(args: Args) -> Result<(), String> {
    ACCEPT_GZIP.store(!args.no_gzip, Ordering::Relaxed);
    let m = measure(&Load {
        tasks: args.tasks,
        connections: args.connections,
        device_bytes: args.device_bytes,
        heartbeat_every: Duration::from_millis(args.heartbeat_ms.max(1)),
        cpu_window: Duration::from_secs(10),
        arrivals_per_second: args.arrivals_per_second,
        heartbeat_batch: Duration::ZERO,
        arrivals_together: false,
    })
    .await?;
    print(&[m], args.no_gzip);
    Ok(())
}

/// Runs `coord-bench scale`; a size that fails is reported and the next one still runs.
pub async fn scale(args: ScaleArgs) -> Result<(), String> {
    ACCEPT_GZIP.store(!args.job.no_gzip, Ordering::Relaxed);
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for &tasks in &args.sizes {
        let load = Load {
            tasks,
            connections: tasks.div_ceil(args.job.tasks_per_connection.max(1)),
            device_bytes: args.job.device_bytes,
            heartbeat_every: Duration::from_millis(args.heartbeat_ms.max(1)),
            cpu_window: Duration::from_secs(15),
            arrivals_per_second: args.arrivals_per_second,
            heartbeat_batch: Duration::from_millis(args.heartbeat_batch_ms),
            arrivals_together: args.arrivals_together,
        };
        match measure(&load).await {
            Ok(m) => done.push(m),
            Err(e) => {
                eprintln!("coord-bench scale: {tasks} tasks failed: {e}");
                failed.push(format!("{tasks} tasks: {e}"));
            }
        }
    }
    print(&done, args.job.no_gzip);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// One size on a fresh ensemble.
async fn measure(load: &Load) -> Result<Measured, String> {
    let heartbeat_timeout = (load.heartbeat_every * 2).max(Duration::from_secs(10));
    let mut cluster = crate::Cluster::start(crate::ClusterOptions {
        extra_args: vec![
            "--worker-threads".into(),
            "1".into(),
            "--job".into(),
            format!("worker={}", load.tasks),
            "--heartbeat-timeout-ms".into(),
            heartbeat_timeout.as_millis().to_string(),
        ],
        log_filter: "warn".into(),
        ..crate::ClusterOptions::default()
    });
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let pid = cluster.pid(leader).ok_or("leader has no process")?;
    let term_before = cluster.status(leader).map_or(0, |s| s.term);
    eprintln!(
        "coord-bench: {} tasks over {} connections, heartbeat every {:?}, leader is replica {leader} (pid {pid})",
        load.tasks, load.connections, load.heartbeat_every
    );
    let mut stalled = 0.0;
    let report = run(cluster.endpoints(), load, pid, summed(&cluster), || {
        stalled = cluster.metric(leader, "coord_replica_stalled_seconds_total");
        cluster.kill(leader)
    })
    .await;
    // A failed size keeps its replicas' logs to be read.
    let report =
        report.map_err(|e| format!("{e} (logs kept in {})", cluster.persist().display()))?;
    // Read off a survivor: the leader is dead by now.
    let survivor = cluster.ids().into_iter().find(|&id| id != leader);
    let after = survivor.and_then(|id| cluster.status(id));
    let elections = after.map_or(0, |s| s.term.saturating_sub(term_before));
    Ok(Measured {
        report,
        connections: load.connections,
        elections,
        stalled,
    })
}

/// The table: a row per measure, a column per size.
fn print(runs: &[Measured], no_gzip: bool) {
    if runs.is_empty() {
        return;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let row = |name: &str, target: &str, cell: &dyn Fn(&Measured) -> String| {
        let cells: Vec<String> = runs.iter().map(cell).collect();
        println!("| {name} | {} | {target} |", cells.join(" | "));
    };
    println!();
    let sizes: Vec<String> = runs
        .iter()
        .map(|m| format!("{} tasks", m.report.tasks))
        .collect();
    println!("| measure (3 replicas) | {} | target |", sizes.join(" | "));
    println!("|---|{}---:|", "---:|".repeat(runs.len()));
    row("connections (tasks share them)", "", &|m| {
        m.connections.to_string()
    });
    row("register all tasks", "", &|m| {
        format!(
            "{:.2} s ({:.0} tasks/s)",
            m.report.register.as_secs_f64(),
            m.report.tasks as f64 / m.report.register.as_secs_f64()
        )
    });
    let gzip = if no_gzip { "" } else { ", gzip accepted" };
    row(
        &format!("WaitForAllTasks, one device per task{gzip}: every answer after the last call"),
        "",
        &|m| {
            // A sidecar's fetch is decompressed before the proxy sees it: its size is the
            // answer's own, and what crossed the wire is the ensemble's one gzip of it.
            let (size, wire) = match (m.report.arrivals_together, m.report.wait_for_all_gzipped) {
                (true, Some(z)) => (
                    "uncompressed, fetched by the sidecars",
                    format!(
                        ", each {:.1} MB gzipped: {:.0} MB on the wire",
                        z as f64 / 1e6,
                        (z * m.report.wait_for_all_fetches) as f64 / 1e6
                    ),
                ),
                (true, None) => ("uncompressed, fetched by the sidecars", String::new()),
                (false, _) => ("on the wire", String::new()),
            };
            format!(
                "{:.2} s ({:.0} MB {size} in {} answers{wire}, {} B devices)",
                m.report.wait_for_all.as_secs_f64(),
                m.report.wait_for_all_bytes as f64 / 1e6,
                m.report.wait_for_all_fetches,
                m.report.device_bytes
            )
        },
    );
    row(
        "barrier released after the last arrival",
        "<= 300 ms",
        &|m| {
            let how = if m.report.arrivals_together {
                " (arrivals together)"
            } else {
                ""
            };
            format!("{} ms{how}", m.report.barrier_release.as_millis())
        },
    );
    row(
        "leader CPU with every task heartbeating",
        "<= 0.5 core",
        &|m| format!("{:.2} cores", m.report.heartbeat_cpu_cores),
    );
    row(
        "... heartbeats a second, and calls carrying them",
        "",
        &|m| {
            format!(
                "{:.0} in {:.0} calls",
                m.report.heartbeats_per_second, m.report.heartbeat_calls_per_second
            )
        },
    );
    row("leader RSS growth per registered task", "", &|m| {
        format!(
            "{:.0} B ({:.0} -> {:.0} MiB)",
            m.report.rss_per_registered_task(),
            mib(m.report.leader_rss_before),
            mib(m.report.leader_rss_registered)
        )
    });
    row(
        "leader RSS growth per parked Barrier call (together: per task waiting)",
        "<= 4096 B",
        &|m| {
            let per = if m.report.arrivals_together {
                " per task waiting"
            } else {
                ""
            };
            format!("{:.0} B{per}", m.report.rss_per_parked_call())
        },
    );
    row(
        "leader RSS growth per parked WaitForAllTasks call",
        "<= 4096 B",
        &|m| format!("{:.0} B", m.report.rss_per_parked_wait()),
    );
    row(
        "leader's own stall before the kill (not counted as silence)",
        "",
        &|m| format!("{:.1} s", m.stalled),
    );
    row("failed heartbeats before the kill", "0", &|m| {
        m.report.heartbeat_errors.to_string()
    });
    row(
        "leader kill -9: longest stall of a task's heartbeats",
        "<= 2000 ms",
        &|m| format!("{} ms", m.report.kill_stall.as_millis()),
    );
    row(
        "... failed heartbeats after the kill (a task declared dead fails them all)",
        "0",
        &|m| m.report.heartbeat_errors_after_kill.to_string(),
    );
    row("elections in the run (the kill's only)", "1", &|m| {
        m.elections.to_string()
    });
    row(
        "the generator's own lateness: latest heartbeat sent after its time (sent over 1 s late)",
        "",
        &|m| {
            let r = &m.report;
            format!(
                "{} ms ({})",
                r.heartbeat_send_late.as_millis(),
                r.heartbeats_sent_late
            )
        },
    );
}

//! What every measurement of `coord-bench tfdata` starts from: the bench's flags ([`Args`]), a
//! coord ensemble and coord-proxy in front of it as a TF host runs them, a replica's `/metrics`, a
//! process's CPU seconds, and the constants both measurements share. A leaf: the throughput
//! rounds, the outages and the script processes all use it, and it uses none of them.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::cluster::{free_ports, workspace_binary};
use crate::venv::Guarded;
use crate::{Cluster, ClusterOptions};

/// Elements of the untimed warm-up read on each system.
pub(super) const WARMUP_ELEMENTS: u64 = 2_000;
/// TF's import takes seconds per process, and several start at once on two cores.
pub(super) const START_PATIENCE: Duration = Duration::from_secs(300);
/// Lines of a process's stderr kept for the message of a failure.
pub(super) const STDERR_TAIL: usize = 20;
/// `/proc/<pid>/stat` counts CPU time in these (`getconf CLK_TCK`).
pub(super) const CLOCK_TICKS: f64 = 100.0;
pub(super) const DYNAMIC: &str = "distributed_epoch";

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Worker counts of the throughput runs (comma separated; 0 skips them).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 16])]
    pub workers: Vec<usize>,
    /// Elements of `range(N)` per timed read, one split each.
    #[arg(long, default_value_t = 50_000)]
    pub elements: u64,
    /// Timed reads per system and workload; the systems alternate and medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Elements per timed read batched on the workers (before `distribute`; 0 skips them).
    #[arg(long, default_value_t = 100_000)]
    pub batched_elements: u64,
    /// Also time heavier elements: each a vector of this many KiB (0 skips them).
    #[arg(long, default_value_t = 16)]
    pub heavy_kib: u64,
    /// Elements per timed read of the heavier elements.
    #[arg(long, default_value_t = 10_000)]
    pub heavy_elements: u64,
    /// Processes the WorkerServers are spread over (each hosts its share of both systems').
    #[arg(long, default_value_t = 4)]
    pub worker_procs: usize,
    /// WorkerServers' heartbeat interval (both systems).
    #[arg(long, default_value_t = 500)]
    pub heartbeat_ms: u64,
    /// Dispatcher kills per kind (coord leader; TF restart; TF standby); 0 skips them.
    #[arg(long, default_value_t = 5)]
    pub kills: usize,
    /// `RUST_LOG` of coord's replicas in the throughput runs (the outage runs log at info: the
    /// elections are read back from the logs).
    #[arg(long, default_value = "warn")]
    pub log: String,
    /// Keep coord's data directories and replica logs, and print where they are.
    #[arg(long)]
    pub keep: bool,
    /// coord-proxy's `--tfdata-split-lease`: splits it takes from the ensemble at once.
    #[arg(long, default_value_t = coord_agent::proxy::tfdata::DEFAULT_SPLIT_LEASE)]
    pub split_lease: u64,
    /// Extra flags for every coord replica (e.g. --coord-arg=--worker-threads=2).
    #[arg(long = "coord-arg")]
    pub coord_args: Vec<String>,
}

pub(super) fn wall() -> f64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    now.map_or(0.0, |d| d.as_secs_f64())
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// CPU seconds (user + system) process `pid` has used (0 if it is gone).
pub(super) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // utime and stime are fields 14 and 15 of stat(5): the 12th and 13th after the command.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields = after.split_whitespace().skip(11).take(2);
    fields.filter_map(|f| f.parse::<f64>().ok()).sum::<f64>() / CLOCK_TICKS
}

/// A coord ensemble: three replicas on two cores, as in `coord-bench kv`.
pub(super) fn ensemble(args: &Args, log: &str) -> Cluster {
    let mut extra: Vec<String> = ["--worker-threads", "1"].map(String::from).into();
    extra.extend(args.coord_args.iter().cloned());
    let log_filter = log.into();
    Cluster::start(ClusterOptions {
        extra_args: extra,
        log_filter,
        ..Default::default()
    })
}

pub(super) fn keep_if_asked(cluster: &mut Cluster, args: &Args, what: &str) {
    if args.keep {
        let dir = cluster.persist();
        eprintln!("  coord's data and logs ({what}): {}", dir.display());
    }
}

/// coord-proxy in front of `cluster`, as a TF host runs it: its process and address.
pub(super) async fn start_proxy(
    cluster: &Cluster,
    args: &Args,
) -> Result<(Guarded, String), String> {
    let bin = workspace_binary("coord-proxy", Some("COORD_PROXY_BIN"));
    let addr = format!("127.0.0.1:{}", free_ports(1)[0]);
    let endpoints = cluster.endpoints().join(",");
    let mut cmd = Command::new(bin);
    let lease = args.split_lease.to_string();
    cmd.args(["--listen", &addr, "--coordinators", &endpoints])
        .args(["--tfdata-split-lease", &lease])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let spawned = cmd.spawn().map_err(|e| format!("start coord-proxy: {e}"))?;
    let proc = Guarded { child: spawned };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        if Instant::now() > deadline {
            return Err(format!("coord-proxy did not listen on {addr}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((proc, addr))
}

/// Every `coord_…` series of replica `id`'s `/metrics`, by its name and labels.
pub(super) fn metrics(cluster: &Cluster, id: u64) -> BTreeMap<String, f64> {
    let (_, body) = crate::http::get(cluster.replica(id).http, "/metrics").unwrap_or_default();
    let series = body.lines().filter(|l| l.starts_with("coord_"));
    series
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.trim_end_matches("{}").to_string(), v.parse().ok()?))
        })
        .collect()
}

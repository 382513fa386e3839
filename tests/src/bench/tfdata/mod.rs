//! `coord-bench tfdata`: coord's `tensorflow.data.DispatcherService` (3 replicas behind
//! coord-proxy) against TensorFlow's own `DispatchServer` (`fault_tolerant_mode=True`: every
//! update journaled), with real TensorFlow on both sides in the same run
//! (`tests/tfdata/tf_bench.py`).
//!
//! - **Throughput**: the same `WorkerServer`s (W per system, spread over a few processes that each
//!   host their share of both systems' workers) and one reader process, outside the workers'
//!   processes so that elements travel over gRPC, read `range(N)` with
//!   `distribute(processing_mode="distributed_epoch")`: one split per element, each handed out by
//!   the dispatcher. Elements/s from the first batch to the last, after an untimed warm-up, every
//!   element checked to come exactly once. The systems alternate round after round and medians
//!   are reported, so that drift in this shared machine's speed hits both alike. More rows:
//!   `range(N).batch(256)`, batched on the workers before `distribute` (the reader fetches
//!   batches, and each of their elements is one split: the dispatcher's largest share), heavier
//!   elements (vectors of some KiB), and the ceiling with no dispatcher in the element path (OFF
//!   sharding). The CPU each process spent per element, and what coord's leader did meanwhile
//!   (its `/metrics`), say where the time went, for each DYNAMIC workload.
//! - **Outage**: a fake worker calls GetSplit back to back (raw RPCs, a real job and iteration
//!   with a heartbeating client) and timestamps each answer; the dispatcher is killed (`kill -9`)
//!   and the figure is the time from the kill to the answer that ended the fake worker's longest
//!   wait after it (answers already on their way, or splits coord-proxy holds, come first).
//!   TF: its process is restarted on the same journal (TF's import included), or, alternately, a
//!   standby process with TF imported builds the `DispatchServer` the moment the kill happens
//!   (TF's best case).
//!   coord: the leader replica is killed; the fake worker talks to coord-proxy, which re-drives
//!   the call on the next leader.
//!
//! - [`script`]: one process of `tf_bench.py` and its JSON events.
//! - [`throughput`]: the alternating throughput rounds.
//! - [`outage`]: the kill-to-next-split measurements.

mod outage;
mod script;
mod throughput;

use outage::{coord_outages, tf_outages, Outages};
use script::Script;
use throughput::Row;

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::cluster::{free_ports, workspace_binary};
use crate::venv::Guarded;
use crate::{Cluster, ClusterOptions};

/// Elements of the untimed warm-up read on each system.
const WARMUP_ELEMENTS: u64 = 2_000;
/// TF's import takes seconds per process, and several start at once on two cores.
const START_PATIENCE: Duration = Duration::from_secs(300);
/// Lines of a process's stderr kept for the message of a failure.
const STDERR_TAIL: usize = 20;
/// `/proc/<pid>/stat` counts CPU time in these (`getconf CLK_TCK`).
const CLOCK_TICKS: f64 = 100.0;
const DYNAMIC: &str = "distributed_epoch";

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

fn wall() -> f64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    now.map_or(0.0, |d| d.as_secs_f64())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (n > 0).then(|| (v[(n - 1) / 2] + v[n / 2]) / 2.0)
}

/// CPU seconds (user + system) process `pid` has used (0 if it is gone).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // utime and stime are fields 14 and 15 of stat(5): the 12th and 13th after the command.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields = after.split_whitespace().skip(11).take(2);
    fields.filter_map(|f| f.parse::<f64>().ok()).sum::<f64>() / CLOCK_TICKS
}

/// A coord ensemble: three replicas on two cores, as in `coord-bench kv`.
fn ensemble(args: &Args, log: &str) -> Cluster {
    let mut extra: Vec<String> = ["--worker-threads", "1"].map(String::from).into();
    extra.extend(args.coord_args.iter().cloned());
    let log_filter = log.into();
    Cluster::start(ClusterOptions {
        extra_args: extra,
        log_filter,
        ..Default::default()
    })
}

fn keep_if_asked(cluster: &mut Cluster, args: &Args, what: &str) {
    if args.keep {
        let dir = cluster.persist();
        eprintln!("  coord's data and logs ({what}): {}", dir.display());
    }
}

/// coord-proxy in front of `cluster`, as a TF host runs it: its process and address.
async fn start_proxy(cluster: &Cluster, args: &Args) -> Result<(Guarded, String), String> {
    let bin = workspace_binary("coord-agent", "coord-proxy", Some("COORD_PROXY_BIN"));
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
fn metrics(cluster: &Cluster, id: u64) -> BTreeMap<String, f64> {
    let (_, body) = crate::http::get(cluster.replica(id).http, "/metrics").unwrap_or_default();
    let series = body.lines().filter(|l| l.starts_with("coord_"));
    series
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.trim_end_matches("{}").to_string(), v.parse().ok()?))
        })
        .collect()
}

/// TF's `DispatchServer` on `port` over the journal in `dir`; `standby`: imports TF and waits
/// for "go".
fn tf_dispatcher(python: &Path, port: u16, dir: &Path, standby: bool) -> Result<Script, String> {
    let (port, dir) = (port.to_string(), dir.display().to_string());
    let mut args = vec!["dispatcher", "--port", &port, "--work-dir", &dir];
    if standby {
        args.push("--standby");
    }
    Script::start(python, &args, &format!("TF dispatcher on port {port}"))
}

/// `v` shown with `f`, or a dash.
fn show(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "–".to_string(), f)
}

fn yes_no(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "–",
    }
}

fn print_throughput(args: &Args, rows: &[Row]) {
    println!(
        "\n| tf.data service, DYNAMIC sharding, TF's own workers and reader (median of {} rounds) | coord elements/s | TF elements/s | coord / TF | target | met | coord / TF had coord's dispatcher path cost nothing |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (c, t) = (median(&r.coord), median(&r.tf));
        let x = c.zip(t).map(|(c, t)| c / t);
        let (target, met) = match r.headline {
            true => ("≥ 2×", yes_no(x.map(|x| x >= 2.0))),
            false => ("", ""),
        };
        let free = r.free_dispatcher.zip(t).map(|(f, t)| f / t);
        let (c, t) = (
            show(c, |v| format!("{v:.0}")),
            show(t, |v| format!("{v:.0}")),
        );
        let (x, free) = (
            show(x, |v| format!("{v:.2}×")),
            show(free, |v| format!("{v:.2}×")),
        );
        println!(
            "| {} | {c} | {t} | {x} | {target} | {met} | {free} |",
            r.label
        );
    }
    println!(
        "\nThe last column: the elements/s coord would read with the same cores busy, all spent by \
         TensorFlow's workers and reader (at the CPU per element they spent under coord), over \
         TF's; no dispatcher can do better on this machine while the reads are CPU-bound (the \
         cores busy are printed with the CPU per element)."
    );
}

fn print_outages(args: &Args, out: &Outages) {
    let c = median(&out.coord);
    println!(
        "\n| dispatcher kill -9 → next split at the worker (median of {} kills each) | seconds | coord / this | target | met |",
        args.kills
    );
    println!("|---|---:|---:|---:|---:|");
    let secs = |v: Option<f64>| show(v, |v| format!("{v:.3} s"));
    println!(
        "| coord: leader replica killed, GetSplit through coord-proxy (a new leader served after {}) | {} | | ≤ 0.5 s | {} |",
        secs(median(&out.coord_elected)),
        secs(c),
        yes_no(c.map(|c| c <= 0.5))
    );
    let restart = "TF: DispatchServer's process restarted on its journal (TF's import included)";
    let standby = "TF: pre-imported standby builds the DispatchServer at the kill (TF's best case)";
    for (what, t) in [(restart, &out.tf_restart), (standby, &out.tf_standby)] {
        let x = c.zip(median(t)).map(|(c, t)| c / t);
        let (t, met) = (secs(median(t)), yes_no(x.map(|x| x <= 0.2)));
        let x = show(x, |v| format!("{v:.2}"));
        println!("| {what} | {t} | {x} | ≤ 0.2 | {met} |");
    }
    let ms = |v: &[f64]| show(median(v), |v| format!("{v:.2} ms"));
    println!(
        "| GetSplit round trip p50, one caller, no kill: coord via coord-proxy / coord's leader direct / TF | {} / {} / {} | | | |",
        ms(&out.coord_p50),
        ms(&out.coord_direct_p50),
        ms(&out.tf_p50)
    );
    match out.lost.is_empty() {
        true => println!(
            "\nNo split was lost across any kill: each outage's next split was the next one."
        ),
        false => println!("\nSplits lost across kills: {}", out.lost.join(", ")),
    }
}

pub async fn run(args: Args) -> Result<(), String> {
    eprintln!("coord-bench tfdata: preparing TensorFlow (a venv, once)");
    let python: PathBuf = tokio::task::spawn_blocking(crate::tfdata::tf_python)
        .await
        .map_err(|e| e.to_string())??;
    let mut rows = Vec::new();
    for &w in args.workers.iter().filter(|&&w| w > 0) {
        eprintln!("coord-bench tfdata: throughput, {w} workers");
        rows.extend(throughput::throughput(&python, &args, w).await?);
    }
    let mut out = Outages::default();
    if args.kills > 0 {
        eprintln!(
            "coord-bench tfdata: TF's dispatcher killed {}×",
            2 * args.kills
        );
        tf_outages(&python, &args, &mut out).await?;
        eprintln!("coord-bench tfdata: coord's leader killed {}×", args.kills);
        coord_outages(&python, &args, &mut out).await?;
    }
    if !rows.is_empty() {
        print_throughput(&args, &rows);
    }
    if args.kills > 0 {
        print_outages(&args, &out);
    }
    Ok(())
}

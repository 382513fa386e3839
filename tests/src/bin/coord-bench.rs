//! coord-bench: benchmarks of coord against its anchors, in one run, on this machine.
//!
//! `coord-bench kv` starts a 3-replica coord ensemble and a 3-member etcd 3.4 cluster (one after
//! the other, real processes on loopback), drives both with the same closed-loop clients, and
//! prints throughput, latency percentiles and coord/etcd ratios, then kills each one's leader under
//! write load and reports the longest write gap a client saw.
//!
//! Build it in release mode: `cargo run --release -p coord-tests --bin coord-bench -- kv`.

use std::sync::Arc;
use std::time::Duration;

/// The clients of both systems allocate a lot per call; glibc's malloc took a fifth of the
/// benchmark process's CPU, which the servers on this shared machine then lacked.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use coord_tests::bench::coord_target::{CoordEnsemble, CoordTarget};
use coord_tests::bench::etcd::{ensure_etcd, EtcdCluster, EtcdEnsemble, EtcdTarget};
use coord_tests::bench::failover::{self, Gap};
use coord_tests::bench::load::{self, LoadResult, OpKind};
use coord_tests::bench::KvTarget;
use coord_tests::{Cluster, ClusterOptions};

#[derive(Parser)]
#[command(
    name = "coord-bench",
    about = "Benchmarks of coord against its anchors"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Key-value put/get throughput and leader-kill write gap, coord vs etcd 3.4.
    Kv(KvArgs),
    /// Agents under steady load while the leader is killed again and again: the longest stall an
    /// agent call sees.
    Failover(FailoverArgs),
    /// Many simulated tasks heartbeating once a second: register, WaitForAllTasks, one barrier
    /// across all; leader CPU and memory.
    Tasks(TasksArgs),
    /// Seeded fault-injection runs (crashes, pauses, partitions) checked for linearizability,
    /// barrier safety, lost writes and the task incarnation rules.
    Chaos(ChaosArgs),
    /// The crash-consistency loop: load, kill -9 one or all replicas, restart, verify.
    Crash(CrashArgs),
    /// The replicated tf.data dispatcher against TensorFlow's own: GetSplit throughput under
    /// DYNAMIC sharding and restore time after a full restart.
    Dispatcher(DispatcherArgs),
    /// Rendezvous tensors worker → worker over the direct links, against iperf3 on loopback;
    /// peer-death detection time.
    Rendezvous(coord_tests::bench::rendezvous::Args),
}

#[derive(clap::Args, Clone)]
struct DispatcherArgs {
    /// Worker counts to measure (comma separated; 0 skips the throughput runs).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 16])]
    workers: Vec<usize>,
    /// Splits (one element each) per throughput run.
    #[arg(long, default_value_t = 50_000)]
    splits: u64,
    /// Journal sizes to restore from (comma separated; 0 skips the restore runs).
    #[arg(long, value_delimiter = ',', default_values_t = [200_000, 1_000_000])]
    restore_updates: Vec<u64>,
    /// Measure coord only (no TensorFlow venv).
    #[arg(long)]
    no_tf: bool,
    /// Skip the end-to-end runs with data-worker processes.
    #[arg(long)]
    no_e2e: bool,
}

#[derive(clap::Args, Clone)]
struct ChaosArgs {
    /// Runs; run i uses seed `seed + i`.
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// Length of each run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The first run's seed (a failed run prints its seed; pass it here to replay it).
    #[arg(long, default_value_t = 1000)]
    seed: u64,
    /// Keep going after a run with anomalies.
    #[arg(long)]
    keep_going: bool,
}

#[derive(clap::Args, Clone)]
struct CrashArgs {
    #[arg(long, default_value_t = 500)]
    cycles: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Clients writing during each cycle.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// The share of cycles that kill all three replicas (the rest kill one at random).
    #[arg(long, default_value_t = 0.3)]
    kill_all_ratio: f64,
}

#[derive(clap::Args, Clone)]
struct FailoverArgs {
    /// Leader kills.
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Agents writing in closed loops.
    #[arg(long, default_value_t = 16)]
    agents: usize,
}

#[derive(clap::Args, Clone)]
struct TasksArgs {
    /// Simulated tasks.
    #[arg(long, default_value_t = 10_000)]
    tasks: usize,
    /// Connections the tasks share (a real job has one per task).
    #[arg(long, default_value_t = 100)]
    connections: usize,
}

#[derive(clap::Args, Clone)]
struct KvArgs {
    /// Operations per workload and round (the 1-client put runs a tenth of it).
    #[arg(long, default_value_t = 30_000)]
    ops: usize,
    /// Rounds per workload; coord and etcd alternate, and medians are reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Connections the clients share (capped at the number of clients).
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// Leader kills for the write-gap measurement (0 skips it).
    #[arg(long, default_value_t = 5)]
    kills: usize,
    /// Writers during the leader kills.
    #[arg(long, default_value_t = 16)]
    failover_clients: usize,
    /// Only benchmark coord.
    #[arg(long)]
    skip_etcd: bool,
    /// Do not apt-get install etcd-server when etcd is missing.
    #[arg(long)]
    no_install: bool,
    /// Run only these workloads (put1, put256, get64); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Benchmark an already running coord ensemble at these gRPC addresses (comma separated)
    /// instead of starting one; leader kills are skipped.
    #[arg(long, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Extra flags for every coord replica (e.g. --coord-arg=--election-timeout-min-ms=200).
    #[arg(long = "coord-arg")]
    coord_args: Vec<String>,
    /// Also run every workload on a second coord ensemble serving TLS (clients presenting an
    /// operator's certificate), in the same rounds, and report TLS against plain gRPC.
    #[arg(long)]
    tls: bool,
}

/// One workload: what, how many clients, how many operations.
#[derive(Clone, Copy)]
struct Workload {
    key: &'static str,
    name: &'static str,
    kind: OpKind,
    clients: usize,
    ops: usize,
    /// The target coord/etcd throughput ratio from the issue.
    target_ratio: f64,
}

fn workloads(args: &KvArgs) -> Vec<Workload> {
    vec![
        Workload {
            key: "put1",
            name: "put, 1 client",
            kind: OpKind::Put,
            clients: 1,
            ops: (args.ops / 10).max(100),
            target_ratio: 1.0,
        },
        Workload {
            key: "put256",
            name: "put, 256 clients",
            kind: OpKind::Put,
            clients: 256,
            ops: args.ops,
            target_ratio: 1.5,
        },
        Workload {
            key: "get64",
            name: "linearizable get, 64 clients",
            kind: OpKind::Get,
            clients: 64,
            ops: args.ops,
            target_ratio: 3.0,
        },
    ]
    .into_iter()
    .filter(|w| args.only.is_empty() || args.only.iter().any(|o| o == w.key))
    .collect()
}

/// One workload's result on both systems: every round's run, and medians.
struct Compared {
    coord: Vec<LoadResult>,
    etcd: Vec<LoadResult>,
    /// The same on the TLS ensemble (`--tls`).
    coord_tls: Vec<LoadResult>,
}

fn median_by<F: Fn(&LoadResult) -> f64>(runs: &[LoadResult], f: F) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Kv(args) => {
            if let Err(e) = kv(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Failover(args) => {
            if let Err(e) = failover_bench(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Tasks(args) => {
            if let Err(e) = coord_tests::bench::tasks::report(args.tasks, args.connections).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Chaos(args) => {
            if !chaos(args).await {
                std::process::exit(1);
            }
        }
        Cmd::Dispatcher(a) => {
            let args = coord_tests::bench::dispatcher::Args {
                workers: a.workers,
                splits: a.splits,
                restore_updates: a.restore_updates,
                no_tf: a.no_tf,
                no_e2e: a.no_e2e,
            };
            if let Err(e) = coord_tests::bench::dispatcher::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Rendezvous(args) => {
            if let Err(e) = coord_tests::bench::rendezvous::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Crash(args) => {
            if !crash(args).await {
                std::process::exit(1);
            }
        }
    }
}

/// Runs `w` once against `target` (warm-up first) and logs the result.
async fn run_once<T: KvTarget>(name: &str, w: &Workload, target: Arc<T>) -> LoadResult {
    load::run(
        target.clone(),
        w.kind,
        w.clients,
        (w.ops / 20).max(w.clients),
    )
    .await;
    let r = load::run(target, w.kind, w.clients, w.ops).await;
    eprintln!(
        "{name:5} {:32} {:>9.0} ops/s  p50 {:>8.2?}  p99 {:>8.2?}  errors {}",
        w.name,
        r.ops_per_sec(),
        r.p50,
        r.p99,
        r.errors
    );
    r
}

fn print_gaps(name: &str, gaps: &[Gap]) {
    let each: Vec<String> = gaps
        .iter()
        .map(|g| {
            let stuck = if g.stuck_clients > 0 {
                format!(" ({} clients stuck)", g.stuck_clients)
            } else {
                String::new()
            };
            format!("{} ms{stuck}", g.worst_gap.as_millis())
        })
        .collect();
    eprintln!(
        "{name:5} leader kill: worst client write gap median {} ms; each kill: {}",
        failover::median(gaps).as_millis(),
        each.join(", ")
    );
}

async fn start_coord(args: &KvArgs, tls: bool) -> Result<Option<Cluster>, String> {
    if !args.endpoints.is_empty() {
        return Ok(None);
    }
    // Three replicas share this machine's cores, so each gets one runtime thread (as the local
    // ensemble script does); --coord-arg can override it.
    let mut extra_args = Vec::new();
    if !args
        .coord_args
        .iter()
        .any(|a| a.starts_with("--worker-threads"))
    {
        extra_args.extend(["--worker-threads".to_string(), "1".to_string()]);
    }
    extra_args.extend(args.coord_args.iter().cloned());
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args,
        log_filter: "warn".into(),
        tls,
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    Ok(Some(cluster))
}

fn coord_term(cluster: &mut Option<Cluster>) -> Option<(u64, u64)> {
    let c = cluster.as_mut()?;
    c.ids()
        .into_iter()
        .find_map(|id| c.status(id).and_then(|s| Some((s.term, s.leader_id?))))
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

async fn kv(args: KvArgs) -> Result<(), String> {
    let wls = workloads(&args);
    eprintln!(
        "coord-bench kv: {} ops per workload, {} rounds, {} connections, 256-byte values, {} cores",
        args.ops,
        args.rounds,
        args.connections,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut coord_cluster = start_coord(&args, false).await?;
    let tls_cluster = if args.tls {
        if !args.endpoints.is_empty() {
            return Err(
                "--tls starts an ensemble of its own; it does not go with --endpoints".into(),
            );
        }
        start_coord(&args, true).await?
    } else {
        None
    };
    let tls_client = tls_cluster.as_ref().map(|c| {
        let pki = c.pki();
        pki.client(Some(&pki.client_identity("bench")))
    });
    let coord_endpoints = match &coord_cluster {
        Some(c) => c.endpoints(),
        None => args.endpoints.clone(),
    };
    let mut etcd_cluster = if args.skip_etcd {
        None
    } else {
        let binary = ensure_etcd(!args.no_install)?;
        let c = EtcdCluster::start(binary, 3)?;
        c.wait_for_leader(Duration::from_secs(60)).await?;
        Some(c)
    };

    // Every workload runs on coord and on etcd in alternation, round after round, so that drift
    // in this shared machine's speed hits both sides alike.
    let term_before = coord_term(&mut coord_cluster);
    let conns = args.connections;
    let mut results = Vec::new();
    for w in &wls {
        let coord_target =
            Arc::new(CoordTarget::connect(coord_endpoints.clone(), conns.min(w.clients)).await?);
        let etcd_target = match &etcd_cluster {
            Some(c) => Some(Arc::new(
                EtcdTarget::connect(c, conns.min(w.clients)).await?,
            )),
            None => None,
        };
        let tls_target = match (&tls_cluster, &tls_client) {
            (Some(c), Some(tls)) => Some(Arc::new(
                CoordTarget::connect_with(c.endpoints(), conns.min(w.clients), Some(tls.clone()))
                    .await?,
            )),
            _ => None,
        };
        if w.kind == OpKind::Get {
            load::preload(&coord_target).await?;
            if let Some(t) = &etcd_target {
                load::preload(t).await?;
            }
            if let Some(t) = &tls_target {
                load::preload(t).await?;
            }
        }
        let mut compared = Compared {
            coord: Vec::new(),
            etcd: Vec::new(),
            coord_tls: Vec::new(),
        };
        for _ in 0..args.rounds {
            compared
                .coord
                .push(run_once("coord", w, coord_target.clone()).await);
            if let Some(t) = &tls_target {
                compared.coord_tls.push(run_once("tls", w, t.clone()).await);
            }
            if let Some(t) = &etcd_target {
                compared.etcd.push(run_once("etcd", w, t.clone()).await);
            }
        }
        results.push(compared);
    }
    let term_after = coord_term(&mut coord_cluster);
    if let (Some((t0, l0)), Some((t1, l1))) = (term_before, term_after) {
        eprintln!("coord  elections during the load workloads: {} (term {t0} -> {t1}, leader {l0} -> {l1})", t1 - t0);
    }

    let mut coord_gaps = Vec::new();
    let mut etcd_gaps = Vec::new();
    if args.kills > 0 {
        if let Some(cluster) = coord_cluster.as_mut() {
            let target = Arc::new(
                CoordTarget::connect(coord_endpoints.clone(), conns.min(args.failover_clients))
                    .await?,
            );
            coord_gaps = failover::measure(
                target,
                &mut CoordEnsemble::new(cluster),
                args.failover_clients,
                args.kills,
            )
            .await;
            print_gaps("coord", &coord_gaps);
        }
        if let Some(cluster) = etcd_cluster.as_mut() {
            let target =
                Arc::new(EtcdTarget::connect(cluster, conns.min(args.failover_clients)).await?);
            etcd_gaps = failover::measure(
                target,
                &mut EtcdEnsemble::new(cluster),
                args.failover_clients,
                args.kills,
            )
            .await;
            print_gaps("etcd", &etcd_gaps);
        }
    }

    println!(
        "\n| workload (median of {} rounds) | coord ops/s | coord p50 ms | coord p99 ms | etcd ops/s | etcd p50 ms | etcd p99 ms | coord/etcd | target |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(&results) {
        let ops = |runs: &[LoadResult]| median_by(runs, LoadResult::ops_per_sec);
        let p50 = |runs: &[LoadResult]| {
            fmt_ms(Duration::from_secs_f64(median_by(runs, |x| {
                x.p50.as_secs_f64()
            })))
        };
        let p99 = |runs: &[LoadResult]| {
            fmt_ms(Duration::from_secs_f64(median_by(runs, |x| {
                x.p99.as_secs_f64()
            })))
        };
        let (e_ops, e50, e99, ratio) = if r.etcd.is_empty() {
            (
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
                "-".to_string(),
            )
        } else {
            (
                format!("{:.0}", ops(&r.etcd)),
                p50(&r.etcd),
                p99(&r.etcd),
                format!("{:.2}x", ops(&r.coord) / ops(&r.etcd).max(1e-9)),
            )
        };
        println!(
            "| {} | {:.0} | {} | {} | {e_ops} | {e50} | {e99} | {ratio} | >= {}x |",
            w.name,
            ops(&r.coord),
            p50(&r.coord),
            p99(&r.coord),
            w.target_ratio
        );
    }
    if !coord_gaps.is_empty() {
        let e_gap = if etcd_gaps.is_empty() {
            "-".to_string()
        } else {
            format!("{} ms", failover::median(&etcd_gaps).as_millis())
        };
        println!(
            "| leader kill -9: longest write gap a client saw, median of {} kills | {} ms | | | {e_gap} | | | | <= 500 ms |",
            args.kills,
            failover::median(&coord_gaps).as_millis()
        );
    }
    if tls_cluster.is_some() {
        print_tls(&args, &wls, &results);
    }
    Ok(())
}

/// The second table of `--tls`: the TLS ensemble against the plain one, same rounds.
fn print_tls(args: &KvArgs, wls: &[Workload], results: &[Compared]) {
    println!(
        "\n| workload (median of {} rounds) | coord ops/s | coord p50 ms | coord over TLS ops/s | TLS p50 ms | TLS p99 ms | TLS/plain |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(results) {
        let ops = |runs: &[LoadResult]| median_by(runs, LoadResult::ops_per_sec);
        let ms = |runs: &[LoadResult], f: fn(&LoadResult) -> Duration| {
            fmt_ms(Duration::from_secs_f64(median_by(runs, |x| {
                f(x).as_secs_f64()
            })))
        };
        println!(
            "| {} | {:.0} | {} | {:.0} | {} | {} | {:.2}x |",
            w.name,
            ops(&r.coord),
            ms(&r.coord, |x| x.p50),
            ops(&r.coord_tls),
            ms(&r.coord_tls, |x| x.p50),
            ms(&r.coord_tls, |x| x.p99),
            ops(&r.coord_tls) / ops(&r.coord).max(1e-9)
        );
    }
}

async fn failover_bench(args: FailoverArgs) -> Result<(), String> {
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: vec!["--worker-threads".into(), "1".into()],
        log_filter: "warn".into(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    eprintln!(
        "coord-bench failover: {} agents, {} leader kills",
        args.agents, args.kills
    );
    let target = Arc::new(coord_tests::bench::agent_target::AgentTarget::new(
        cluster.endpoints(),
        args.agents,
    )?);
    let gaps = failover::measure(
        target,
        &mut CoordEnsemble::new(&mut cluster),
        args.agents,
        args.kills,
    )
    .await;
    print_gaps("coord", &gaps);
    let mut sorted: Vec<Duration> = gaps.iter().map(|g| g.worst_gap).collect();
    sorted.sort_unstable();
    let max = sorted.last().copied().unwrap_or_default();
    let stuck: usize = gaps.iter().map(|g| g.stuck_clients).sum();
    println!(
        "\n| leader kills under agent load ({} agents) | value | target |",
        args.agents
    );
    println!("|---|---:|---:|");
    println!("| kills | {} | |", gaps.len());
    println!(
        "| longest stall an agent call saw, median over kills | {} ms | <= 500 ms |",
        failover::median(&gaps).as_millis()
    );
    println!(
        "| longest stall an agent call saw, worst kill | {} ms | <= 1500 ms |",
        max.as_millis()
    );
    println!("| agents that did not recover within 30 s | {stuck} | 0 |");
    Ok(())
}

/// Runs the chaos schedules one after another; true when every run was clean.
async fn chaos(args: ChaosArgs) -> bool {
    use coord_tests::chaos::runner::{run, RunOptions};
    let started = std::time::Instant::now();
    let (mut clean, mut ops, mut unknown, mut faults) = (0u64, 0usize, 0usize, 0usize);
    let mut failed = Vec::new();
    let mut longest = Duration::ZERO;
    for i in 0..args.runs {
        let seed = args.seed + i;
        let report = run(&RunOptions::new(seed, Duration::from_secs(args.seconds))).await;
        println!("run {}/{}: {}", i + 1, args.runs, report.summary());
        for a in &report.anomalies {
            println!("  anomaly: {a}");
        }
        ops += report.kv_ops;
        unknown += report.kv_unknown;
        longest = longest.max(report.longest_after_heal);
        faults += report.faults;
        if report.anomalies.is_empty() {
            clean += 1;
        } else {
            failed.push(seed);
            if !args.keep_going {
                break;
            }
        }
    }
    println!(
        "chaos: {clean} clean runs of {} s, {} with anomalies (seeds {failed:?}); {faults} faults, {ops} kv operations checked ({unknown} unknown); longest call after a run's last heal {:.3} s (bound {:.1} s); {:.0} s",
        args.seconds,
        failed.len(),
        longest.as_secs_f64(),
        coord_tests::chaos::recovery::BOUND.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    failed.is_empty()
}

/// Runs the crash-consistency loop; true when it found nothing.
async fn crash(args: CrashArgs) -> bool {
    use coord_tests::chaos::crash::{crash_loop, CrashOptions};
    let started = std::time::Instant::now();
    let report = crash_loop(&CrashOptions {
        cycles: args.cycles,
        seed: args.seed,
        clients: args.clients,
        kill_all_ratio: args.kill_all_ratio,
    })
    .await;
    println!(
        "crash: {} ({:.0} s)",
        report.summary(),
        started.elapsed().as_secs_f64()
    );
    for a in &report.anomalies {
        println!("  anomaly: {a}");
    }
    report.anomalies.is_empty()
}

//! `coord-bench kv`: key-value throughput and latency of a 3-replica coord ensemble against a
//! 3-member etcd 3.4 cluster (real processes on loopback, started one after the other), driven by
//! the same closed-loop clients; then the longest write gap a client sees when each one's leader
//! is killed under write load.
//!
//! Every workload runs on coord and on etcd in alternation, round after round, and medians are
//! reported, so that drift in a shared machine's speed hits both sides alike. `--tls` adds a
//! second coord ensemble serving TLS and a second etcd cluster serving mutual TLS on its client
//! and peer ports, measured in the same rounds, and tables of coord's TLS against its plain gRPC
//! and against etcd over TLS. `--sled` adds a second coord ensemble on the sled Raft log engine,
//! in the same rounds, and a table of it against the segment log (the first ensemble's) and etcd,
//! with every system's data directory size after the load rounds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use coord_proto::tls::ClientTls;

use super::coord_target::{CoordEnsemble, CoordTarget, RaftLog};
use super::etcd::{ensure_etcd, EtcdCluster, EtcdEnsemble, EtcdTarget};
use super::failover;
use super::failover_report::print_gaps;
use super::load::{self, LoadResult, OpKind};
use super::{disk_usage, mb, DiskUsage, KvTarget};
use crate::{Cluster, ClusterOptions};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Operations per workload and round (the 1-client put runs a tenth of it).
    #[arg(long, default_value_t = 30_000)]
    pub ops: usize,
    /// Rounds per workload; coord and etcd alternate, and medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Connections the clients share (capped at the number of clients).
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Leader kills for the write-gap measurement (0 skips it).
    #[arg(long, default_value_t = 5)]
    pub kills: usize,
    /// Writers during the leader kills.
    #[arg(long, default_value_t = 16)]
    pub failover_clients: usize,
    /// Only benchmark coord (starts neither etcd cluster, plain or TLS).
    #[arg(long)]
    pub skip_etcd: bool,
    /// Do not apt-get install etcd-server when etcd is missing.
    #[arg(long)]
    pub no_install: bool,
    /// Run only these workloads (put1, put256, get64); all by default.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Benchmark an already running coord ensemble at these gRPC addresses (comma separated)
    /// instead of starting one; leader kills are skipped.
    #[arg(long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Extra flags for every coord replica (e.g. --coord-arg=--election-timeout-min-ms=200).
    #[arg(long = "coord-arg")]
    pub coord_args: Vec<String>,
    /// Also run every workload on a second coord ensemble serving TLS (clients presenting an
    /// operator's certificate) and on a second etcd cluster serving mutual TLS (client and peer
    /// ports), in the same rounds, and report TLS against plain gRPC and against etcd over TLS.
    #[arg(long)]
    pub tls: bool,
    /// Also run every workload on a second coord ensemble keeping its Raft log in sled
    /// (`--raft-log sled`; the first one runs `--raft-log segments`), in the same rounds, and
    /// report it against the segment log and etcd, with each system's data directories' size
    /// after the load rounds.
    #[arg(long)]
    pub sled: bool,
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
    /// The target throughput ratio of coord over TLS to etcd over TLS (issue 26).
    tls_target_ratio: f64,
}

/// The target throughput of coord over TLS against coord over plain gRPC (issue 26), every
/// workload alike.
const TLS_PLAIN_TARGET: f64 = 0.85;

fn workloads(args: &Args) -> Vec<Workload> {
    vec![
        Workload {
            key: "put1",
            name: "put, 1 client",
            kind: OpKind::Put,
            clients: 1,
            ops: (args.ops / 10).max(100),
            target_ratio: 1.0,
            tls_target_ratio: 1.2,
        },
        Workload {
            key: "put256",
            name: "put, 256 clients",
            kind: OpKind::Put,
            clients: 256,
            ops: args.ops,
            target_ratio: 1.5,
            tls_target_ratio: 1.5,
        },
        Workload {
            key: "get64",
            name: "linearizable get, 64 clients",
            kind: OpKind::Get,
            clients: 64,
            ops: args.ops,
            target_ratio: 3.0,
            tls_target_ratio: 3.0,
        },
    ]
    .into_iter()
    .filter(|w| args.only.is_empty() || args.only.iter().any(|o| o == w.key))
    .collect()
}

/// Labels of the systems measured in the rounds: the first coord ensemble (the segment log), its
/// second ensembles (`--tls`, `--sled`), and the etcd clusters (plain; mutual TLS with `--tls`).
const COORD: &str = "coord";
const TLS: &str = "tls";
const SLED: &str = "sled";
const ETCD: &str = "etcd";
const ETCD_TLS: &str = "etcd-tls";

/// One workload's result on every system: each round's run, by system label.
struct Compared(Vec<(&'static str, Vec<LoadResult>)>);

impl Compared {
    /// `label`'s runs; none when that system was not measured.
    fn of(&self, label: &str) -> &[LoadResult] {
        self.0
            .iter()
            .find(|(l, _)| *l == label)
            .map_or(&[], |(_, runs)| runs.as_slice())
    }
}

fn median_by<F: Fn(&LoadResult) -> f64>(runs: &[LoadResult], f: F) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn ops(runs: &[LoadResult]) -> f64 {
    median_by(runs, LoadResult::ops_per_sec)
}

/// The median of a latency over `runs`, in ms.
fn ms(runs: &[LoadResult], f: fn(&LoadResult) -> Duration) -> String {
    fmt_ms(Duration::from_secs_f64(median_by(runs, |x| {
        f(x).as_secs_f64()
    })))
}

/// `a/b` of the median throughputs, or "-" when either was not measured.
fn ratio(a: &[LoadResult], b: &[LoadResult]) -> String {
    if a.is_empty() || b.is_empty() {
        return "-".into();
    }
    format!("{:.2}x", ops(a) / ops(b).max(1e-9))
}

/// The median throughput, or "-" when not measured.
fn ops_cell(runs: &[LoadResult]) -> String {
    if runs.is_empty() {
        return "-".into();
    }
    format!("{:.0}", ops(runs))
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
        "{name:8} {:32} {:>9.0} ops/s  p50 {:>8.2?}  p99 {:>8.2?}  errors {}",
        w.name,
        r.ops_per_sec(),
        r.p50,
        r.p99,
        r.errors
    );
    r
}

/// A coord ensemble measured in the rounds. The first is the ensemble at `--endpoints` or one
/// started here on the segment log; `--tls` and `--sled` each add a second one, started by the
/// same code with one difference (TLS, or `--raft-log sled`).
struct CoordSystem {
    label: &'static str,
    /// `None` for an ensemble at `--endpoints`.
    cluster: Option<Cluster>,
    endpoints: Vec<String>,
    /// What the clients present to a TLS ensemble.
    client_tls: Option<ClientTls>,
}

impl CoordSystem {
    async fn start(
        args: &Args,
        label: &'static str,
        tls: bool,
        engine: RaftLog,
    ) -> Result<Self, String> {
        let cluster = start_coord(args, tls, engine).await?;
        let client_tls = tls.then(|| {
            let pki = cluster.pki();
            pki.client(Some(&pki.client_identity("bench")))
        });
        Ok(Self {
            label,
            endpoints: cluster.endpoints(),
            cluster: Some(cluster),
            client_tls,
        })
    }

    async fn target(&self, connections: usize) -> Result<Arc<CoordTarget>, String> {
        Ok(Arc::new(
            CoordTarget::connect_with(self.endpoints.clone(), connections, self.client_tls.clone())
                .await?,
        ))
    }
}

/// One system's clients for one workload.
enum Lane {
    Coord(Arc<CoordTarget>),
    Etcd(Arc<EtcdTarget>),
}

impl Lane {
    async fn preload(&self) -> Result<(), String> {
        match self {
            Lane::Coord(t) => load::preload(t).await,
            Lane::Etcd(t) => load::preload(t).await,
        }
    }

    async fn run_once(&self, label: &str, w: &Workload) -> LoadResult {
        match self {
            Lane::Coord(t) => run_once(label, w, t.clone()).await,
            Lane::Etcd(t) => run_once(label, w, t.clone()).await,
        }
    }
}

/// Starts three replicas on this machine with the log on `engine`, and waits for a leader.
async fn start_coord(args: &Args, tls: bool, engine: RaftLog) -> Result<Cluster, String> {
    // Three replicas share this machine's cores, so each gets one runtime thread (as the local
    // ensemble script does); --coord-arg can override it, and the log engine unless `--sled`.
    let given = |flag: &str| args.coord_args.iter().any(|a| a.starts_with(flag));
    let mut extra_args = Vec::new();
    if !given("--worker-threads") {
        extra_args.extend(["--worker-threads".to_string(), "1".to_string()]);
    }
    if !given("--raft-log") {
        extra_args.extend(engine.args());
    }
    extra_args.extend(args.coord_args.iter().cloned());
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args,
        log_filter: "warn".into(),
        tls,
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    Ok(cluster)
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

/// The coord ensembles: the first, then `--tls`'s and `--sled`'s.
async fn start_coords(args: &Args) -> Result<Vec<CoordSystem>, String> {
    if !args.endpoints.is_empty() {
        for (flag, on) in [("--tls", args.tls), ("--sled", args.sled)] {
            if on {
                return Err(format!(
                    "{flag} starts an ensemble of its own; it does not go with --endpoints"
                ));
            }
        }
    }
    if args.sled && args.coord_args.iter().any(|a| a.starts_with("--raft-log")) {
        return Err("--sled sets each ensemble's --raft-log; leave it out of --coord-arg".into());
    }
    let mut systems = Vec::new();
    if args.endpoints.is_empty() {
        systems.push(CoordSystem::start(args, COORD, false, RaftLog::Segments).await?);
    } else {
        systems.push(CoordSystem {
            label: COORD,
            cluster: None,
            endpoints: args.endpoints.clone(),
            client_tls: None,
        });
    }
    if args.tls {
        systems.push(CoordSystem::start(args, TLS, true, RaftLog::Segments).await?);
    }
    if args.sled {
        systems.push(CoordSystem::start(args, SLED, false, RaftLog::Sled).await?);
    }
    Ok(systems)
}

/// Runs the `coord-bench kv` benchmark and prints its tables.
pub async fn run(args: Args) -> Result<(), String> {
    let wls = workloads(&args);
    eprintln!(
        "coord-bench kv: {} ops per workload, {} rounds, {} connections, 256-byte values, {} cores",
        args.ops,
        args.rounds,
        args.connections,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let mut coords = start_coords(&args).await?;
    let mut etcds = start_etcd(&args).await?;

    // Every workload runs on every system in alternation, round after round, so that drift in
    // this shared machine's speed hits them all alike.
    let terms_before: Vec<_> = coords
        .iter_mut()
        .map(|s| coord_term(&mut s.cluster))
        .collect();
    let conns = args.connections;
    let mut results = Vec::new();
    for w in &wls {
        let mut lanes = Vec::new();
        for s in &coords {
            lanes.push((s.label, Lane::Coord(s.target(conns.min(w.clients)).await?)));
        }
        for (label, c) in &etcds {
            let t = EtcdTarget::connect(c, conns.min(w.clients)).await?;
            lanes.push((*label, Lane::Etcd(Arc::new(t))));
        }
        if w.kind == OpKind::Get {
            for (_, lane) in &lanes {
                lane.preload().await?;
            }
        }
        let mut compared = Compared(lanes.iter().map(|(l, _)| (*l, Vec::new())).collect());
        for _ in 0..args.rounds {
            for ((label, lane), (_, runs)) in lanes.iter().zip(compared.0.iter_mut()) {
                runs.push(lane.run_once(label, w).await);
            }
        }
        results.push(compared);
    }
    for (s, before) in coords.iter_mut().zip(terms_before) {
        if let (Some((t0, l0)), Some((t1, l1))) = (before, coord_term(&mut s.cluster)) {
            eprintln!(
                "{:6} elections during the load workloads: {} (term {t0} -> {t1}, leader {l0} -> {l1})",
                s.label,
                t1 - t0
            );
        }
    }
    // What the load rounds left on disk, before the leader kills write more on some systems.
    let sizes = args.sled.then(|| data_sizes(&coords, &etcds));

    let mut coord_gaps = Vec::new();
    let mut etcd_gaps = Vec::new();
    if args.kills > 0 {
        let coord_endpoints = coords[0].endpoints.clone();
        if let Some(cluster) = coords[0].cluster.as_mut() {
            let target = Arc::new(
                CoordTarget::connect(coord_endpoints, conns.min(args.failover_clients)).await?,
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
        if let Some((_, cluster)) = etcds.iter_mut().find(|(l, _)| *l == ETCD) {
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
        let (coord, etcd) = (r.of(COORD), r.of(ETCD));
        let (e50, e99) = if etcd.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            (ms(etcd, |x| x.p50), ms(etcd, |x| x.p99))
        };
        println!(
            "| {} | {:.0} | {} | {} | {} | {e50} | {e99} | {} | >= {}x |",
            w.name,
            ops(coord),
            ms(coord, |x| x.p50),
            ms(coord, |x| x.p99),
            ops_cell(etcd),
            ratio(coord, etcd),
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
    if args.tls {
        print_tls(&args, &wls, &results);
        print_tls_vs_etcd(&args, &wls, &results);
    }
    if let Some(sizes) = sizes {
        print_sled(&args, &wls, &results);
        print_sizes(&sizes);
    }
    Ok(())
}

/// The etcd clusters: plain, and serving TLS with `--tls`; none with `--skip-etcd`. They start
/// one after the other, each waiting for its leader, as the coord ensembles do.
async fn start_etcd(args: &Args) -> Result<Vec<(&'static str, EtcdCluster)>, String> {
    if args.skip_etcd {
        return Ok(Vec::new());
    }
    let binary = ensure_etcd(!args.no_install)?;
    let plain = EtcdCluster::start(binary.clone(), 3)?;
    plain.wait_for_leader(Duration::from_secs(60)).await?;
    if !args.tls {
        return Ok(vec![(ETCD, plain)]);
    }
    let tls = EtcdCluster::start_tls(binary, 3)?;
    tls.wait_for_leader(Duration::from_secs(60))
        .await
        .map_err(|e| format!("etcd over TLS: {e}"))?;
    Ok(vec![(ETCD, plain), (ETCD_TLS, tls)])
}

/// The second table of `--tls`: the TLS ensemble against the plain one, same rounds.
fn print_tls(args: &Args, wls: &[Workload], results: &[Compared]) {
    println!(
        "\n| workload (median of {} rounds) | coord ops/s | coord p50 ms | coord over TLS ops/s | TLS p50 ms | TLS p99 ms | TLS/plain |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(results) {
        let (coord, tls) = (r.of(COORD), r.of(TLS));
        println!(
            "| {} | {:.0} | {} | {:.0} | {} | {} | {} |",
            w.name,
            ops(coord),
            ms(coord, |x| x.p50),
            ops(tls),
            ms(tls, |x| x.p50),
            ms(tls, |x| x.p99),
            ratio(tls, coord)
        );
    }
}

/// The third table of `--tls`: coord over TLS against etcd over TLS and against coord over plain
/// gRPC, same rounds, each against issue 26's target. Ratios are of the medians' throughputs, as
/// in the other tables.
fn print_tls_vs_etcd(args: &Args, wls: &[Workload], results: &[Compared]) {
    println!(
        "\n| workload (median of {} rounds) | coord TLS ops/s | etcd TLS ops/s | coord TLS/etcd TLS | target | coord TLS/plain | target |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(results) {
        let (coord, tls, etcd_tls) = (r.of(COORD), r.of(TLS), r.of(ETCD_TLS));
        println!(
            "| {} | {:.0} | {} | {} | >= {}x | {} | >= {}x |",
            w.name,
            ops(tls),
            ops_cell(etcd_tls),
            ratio(tls, etcd_tls),
            w.tls_target_ratio,
            ratio(tls, coord),
            TLS_PLAIN_TARGET
        );
    }
}

/// The table of `--sled`: the ensemble on the sled log against the one on the segment log and
/// against etcd, same rounds.
fn print_sled(args: &Args, wls: &[Workload], results: &[Compared]) {
    println!(
        "\n| workload (median of {} rounds) | segments ops/s | sled ops/s | etcd ops/s | sled/segments | sled/etcd | segments p50 ms | sled p50 ms | sled p99 ms |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(results) {
        let (segments, sled, etcd) = (r.of(COORD), r.of(SLED), r.of(ETCD));
        println!(
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |",
            w.name,
            ops(segments),
            ops(sled),
            ops_cell(etcd),
            ratio(sled, segments),
            ratio(sled, etcd),
            ms(segments, |x| x.p50),
            ms(sled, |x| x.p50),
            ms(sled, |x| x.p99)
        );
    }
}

/// One system's data directories after the load rounds, all replicas (members) together: in
/// all, and its log's share (coord: `raft/`; etcd: `member/wal`). `None` where they were not
/// found.
struct DataSize {
    label: &'static str,
    total: Option<DiskUsage>,
    log: Option<DiskUsage>,
}

/// The data directories of the segment ensemble, the sled ensemble and plain etcd.
fn data_sizes(coords: &[CoordSystem], etcds: &[(&'static str, EtcdCluster)]) -> Vec<DataSize> {
    let mut sizes = Vec::new();
    for s in coords
        .iter()
        .filter(|s| s.label == COORD || s.label == SLED)
    {
        let dirs: Vec<PathBuf> = s.cluster.as_ref().map_or(Vec::new(), |c| {
            c.ids()
                .iter()
                .map(|&id| c.replica(id).data_dir.clone())
                .collect()
        });
        sizes.push(DataSize {
            label: s.label,
            total: (!dirs.is_empty()).then(|| dirs.iter().map(|d| disk_usage(d)).sum()),
            log: (!dirs.is_empty()).then(|| dirs.iter().map(|d| disk_usage(&d.join("raft"))).sum()),
        });
    }
    let etcd = etcds
        .iter()
        .find(|(l, _)| *l == ETCD)
        .map(|(_, c)| c.endpoints());
    let dirs = etcd.as_deref().map_or(Vec::new(), etcd_data_dirs);
    if let Some(eps) = &etcd {
        if dirs.len() != eps.len() {
            eprintln!(
                "etcd: found the data directories of {} of {} members",
                dirs.len(),
                eps.len()
            );
        }
    }
    let found = etcd.is_some_and(|eps| dirs.len() == eps.len());
    sizes.push(DataSize {
        label: ETCD,
        total: found.then(|| dirs.iter().map(|d| disk_usage(d)).sum()),
        log: found.then(|| {
            dirs.iter()
                .map(|d| disk_usage(&d.join("member").join("wal")))
                .sum()
        }),
    });
    for s in &sizes {
        if let (Some(t), Some(l)) = (s.total, s.log) {
            eprintln!(
                "{:8} data directories: {} on disk ({} apparent), log {} on disk ({} apparent)",
                s.label,
                mb(t.on_disk),
                mb(t.apparent),
                mb(l.on_disk),
                mb(l.apparent)
            );
        }
    }
    sizes
}

/// The data directories of the etcd members listening on `endpoints` (`127.0.0.1:port`), read
/// from their command lines in `/proc`: [`EtcdCluster`] keeps its members' paths to itself.
fn etcd_data_dirs(endpoints: &[String]) -> Vec<PathBuf> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for p in procs.flatten() {
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let value = |flag: &str| {
            let i = argv.iter().position(|a| a == flag)?;
            argv.get(i + 1)
        };
        let (Some(listen), Some(dir)) = (value("--listen-client-urls"), value("--data-dir")) else {
            continue;
        };
        if endpoints
            .iter()
            .any(|ep| listen.ends_with(&format!("://{ep}")))
        {
            dirs.push(PathBuf::from(dir));
        }
    }
    dirs
}

/// The data-directory table of `--sled`.
fn print_sizes(sizes: &[DataSize]) {
    let cell = |label: &str, f: fn(&DataSize) -> Option<DiskUsage>| {
        sizes
            .iter()
            .find(|s| s.label == label)
            .and_then(f)
            .map_or("-".to_string(), |u| mb(u.on_disk))
    };
    println!("\n| data directories after the load rounds, 3 replicas together (du) | segments | sled | etcd |");
    println!("|---|---:|---:|---:|");
    for (row, f) in [
        (
            "in all",
            (|s: &DataSize| s.total) as fn(&DataSize) -> Option<DiskUsage>,
        ),
        ("the log (coord: raft/; etcd: member/wal)", |s| s.log),
    ] {
        println!(
            "| {row} | {} | {} | {} |",
            cell(COORD, f),
            cell(SLED, f),
            cell(ETCD, f)
        );
    }
}

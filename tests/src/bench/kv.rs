//! `coord-bench kv`: key-value throughput and latency of a 3-replica coord ensemble against a
//! 3-member etcd 3.4 cluster (real processes on loopback, started one after the other), driven by
//! the same closed-loop clients; then the longest write gap a client sees when each one's leader
//! is killed under write load.
//!
//! Every workload runs on coord and on etcd in alternation, round after round, and medians are
//! reported, so that drift in a shared machine's speed hits both sides alike. `--tls` adds a
//! second coord ensemble serving TLS and a second etcd cluster serving mutual TLS on its client
//! and peer ports, measured in the same rounds, and tables of coord's TLS against its plain gRPC
//! and against etcd over TLS.

use std::sync::Arc;
use std::time::Duration;

use super::coord_target::{CoordEnsemble, CoordTarget};
use super::etcd::{ensure_etcd, EtcdCluster, EtcdEnsemble, EtcdTarget};
use super::failover;
use super::failover_report::print_gaps;
use super::load::{self, LoadResult, OpKind};
use super::KvTarget;
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

/// One workload's result on both systems: every round's run, and medians.
struct Compared {
    coord: Vec<LoadResult>,
    etcd: Vec<LoadResult>,
    /// The same on the TLS ensemble (`--tls`).
    coord_tls: Vec<LoadResult>,
    /// The same on the etcd cluster serving TLS (`--tls`).
    etcd_tls: Vec<LoadResult>,
}

fn median_by<F: Fn(&LoadResult) -> f64>(runs: &[LoadResult], f: F) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
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

async fn start_coord(args: &Args, tls: bool) -> Result<Option<Cluster>, String> {
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
    let (mut etcd_cluster, etcd_tls_cluster) = start_etcd(&args).await?;

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
        let etcd_tls_target = match &etcd_tls_cluster {
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
            if let Some(t) = &etcd_tls_target {
                load::preload(t).await?;
            }
        }
        let mut compared = Compared {
            coord: Vec::new(),
            etcd: Vec::new(),
            coord_tls: Vec::new(),
            etcd_tls: Vec::new(),
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
            if let Some(t) = &etcd_tls_target {
                compared
                    .etcd_tls
                    .push(run_once("etcd-tls", w, t.clone()).await);
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
        print_tls_vs_etcd(&args, &wls, &results);
    }
    Ok(())
}

/// The etcd clusters: plain, and serving TLS with `--tls`; none with `--skip-etcd`. They start
/// one after the other, each waiting for its leader, as the coord ensembles do.
async fn start_etcd(args: &Args) -> Result<(Option<EtcdCluster>, Option<EtcdCluster>), String> {
    if args.skip_etcd {
        return Ok((None, None));
    }
    let binary = ensure_etcd(!args.no_install)?;
    let plain = EtcdCluster::start(binary.clone(), 3)?;
    plain.wait_for_leader(Duration::from_secs(60)).await?;
    if !args.tls {
        return Ok((Some(plain), None));
    }
    let tls = EtcdCluster::start_tls(binary, 3)?;
    tls.wait_for_leader(Duration::from_secs(60))
        .await
        .map_err(|e| format!("etcd over TLS: {e}"))?;
    Ok((Some(plain), Some(tls)))
}

/// The second table of `--tls`: the TLS ensemble against the plain one, same rounds.
fn print_tls(args: &Args, wls: &[Workload], results: &[Compared]) {
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
        let ops = |runs: &[LoadResult]| median_by(runs, LoadResult::ops_per_sec);
        let (etcd_ops, vs_etcd) = if r.etcd_tls.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.0}", ops(&r.etcd_tls)),
                format!("{:.2}x", ops(&r.coord_tls) / ops(&r.etcd_tls).max(1e-9)),
            )
        };
        println!(
            "| {} | {:.0} | {etcd_ops} | {vs_etcd} | >= {}x | {:.2}x | >= {}x |",
            w.name,
            ops(&r.coord_tls),
            w.tls_target_ratio,
            ops(&r.coord_tls) / ops(&r.coord).max(1e-9),
            TLS_PLAIN_TARGET
        );
    }
}

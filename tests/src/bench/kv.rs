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
//!
//! Modules, bottom up: `plan` (the flags, the workloads, the systems' labels), `tables` (the
//! results and the tables they make), `systems` (starting each system, running a workload on
//! it), `sizes` (data directories on disk). This module runs the rounds and the leader kills.

mod plan;
mod sizes;
mod systems;
mod tables;

pub use plan::Args;

use std::sync::Arc;

use super::coord_target::{CoordEnsemble, CoordTarget};
use super::etcd::{EtcdEnsemble, EtcdTarget};
use super::failover;
use super::failover_report::print_gaps;
use super::load::OpKind;
use plan::{workloads, COORD, ETCD};
use sizes::{data_sizes, print_sizes};
use systems::{coord_term, start_coords, start_etcd, Lane};
use tables::{ms, ops, ops_cell, print_sled, print_tls, print_tls_vs_etcd, ratio, Compared};

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

//! `coord-bench rolling`: a rolling restart of the whole ensemble (one replica at a time, the
//! leader last) under agent load, stopped gracefully (SIGTERM: the leader hands leadership over
//! first, see `coord_server::raft::handoff`) against the same restart with kill -9, alternating
//! in one run; each replica stays down for `--downtime-ms` either way. Per restart: the longest stall an agent call saw (the longest time between two
//! acknowledged calls of one agent), and any call that failed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::agent_target::AgentTarget;
use super::KvTarget;
use crate::{Cluster, ClusterOptions};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Rolling restarts of each kind.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Agents writing in closed loops.
    #[arg(long, default_value_t = 16)]
    pub agents: usize,
    /// How long each replica stays down before it is started again (a binary swap, a node
    /// reboot). A leader killed and restarted within the lease comes back leader of the same
    /// term before anyone noticed, which measures nothing.
    #[arg(long, default_value_t = 1000)]
    pub downtime_ms: u64,
}

const TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    Graceful,
    Kill,
}

/// One agent's acknowledgement times, and its failed calls.
type AgentLog = Arc<Mutex<(Vec<Instant>, usize)>>;

/// One rolling restart's outcome.
struct Restart {
    longest_stall: Duration,
    failed: usize,
}

pub async fn run(args: Args) -> Result<(), String> {
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: vec!["--worker-threads".into(), "1".into()],
        log_filter: "warn".into(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(TIMEOUT).await;
    let target = Arc::new(AgentTarget::new(cluster.endpoints(), args.agents)?);
    eprintln!(
        "coord-bench rolling: {} agents, {} rolling restarts of each kind, alternating",
        args.agents, args.rounds
    );
    let mut results: Vec<(Stop, Restart)> = Vec::new();
    for round in 0..args.rounds {
        for stop in [Stop::Graceful, Stop::Kill] {
            let downtime = Duration::from_millis(args.downtime_ms);
            let r = restart_all(&mut cluster, &target, args.agents, stop, downtime).await;
            eprintln!(
                "round {round} {stop:?}: longest stall {} ms, {} failed calls",
                r.longest_stall.as_millis(),
                r.failed
            );
            results.push((stop, r));
        }
    }
    let median = |kind: Stop| {
        let mut v: Vec<Duration> = results
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, r)| r.longest_stall)
            .collect();
        v.sort_unstable();
        (
            v.get(v.len() / 2).copied().unwrap_or_default(),
            v.last().copied().unwrap_or_default(),
        )
    };
    let failed = |kind: Stop| -> usize {
        results
            .iter()
            .filter(|(k, _)| *k == kind)
            .map(|(_, r)| r.failed)
            .sum()
    };
    let (g, g_max) = median(Stop::Graceful);
    let (k, k_max) = median(Stop::Kill);
    println!(
        "\n| rolling restart of 3 replicas under {} agents ({} each, {} ms down each) | SIGTERM (handoff) | kill -9 | ratio |",
        args.agents, args.rounds, args.downtime_ms
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| longest stall an agent call saw, median | {} ms | {} ms | {:.2} |",
        g.as_millis(),
        k.as_millis(),
        g.as_secs_f64() / k.as_secs_f64().max(1e-9)
    );
    println!(
        "| longest stall, worst restart | {} ms | {} ms | |",
        g_max.as_millis(),
        k_max.as_millis()
    );
    println!(
        "| failed calls | {} | {} | |",
        failed(Stop::Graceful),
        failed(Stop::Kill)
    );
    println!("\ntarget: median with handoff <= 100 ms");
    Ok(())
}

/// Restarts every replica once, the leader last, under load; returns what the agents saw.
async fn restart_all(
    cluster: &mut Cluster,
    target: &Arc<AgentTarget>,
    agents: usize,
    stop: Stop,
    downtime: Duration,
) -> Restart {
    let done = Arc::new(AtomicBool::new(false));
    let acks: Vec<AgentLog> = (0..agents).map(|_| Arc::default()).collect();
    let tasks: Vec<_> = (0..agents)
        .map(|a| {
            let (target, done, acks) = (target.clone(), done.clone(), acks[a].clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let key = format!("bench/rolling/{a}/{}", i % 64);
                    let ok = target
                        .put(a, key, Bytes::from_static(&[b'r'; 256]))
                        .await
                        .is_ok();
                    if let Ok(mut s) = acks.lock() {
                        if ok {
                            s.0.push(Instant::now());
                        } else {
                            s.1 += 1;
                        }
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let started = Instant::now();
    let first = cluster.wait_for_leader(TIMEOUT).await;
    let mut order: Vec<u64> = cluster.ids().into_iter().filter(|i| *i != first).collect();
    order.push(first);
    for id in order {
        match stop {
            Stop::Graceful => {
                tokio::task::block_in_place(|| cluster.terminate(id, Duration::from_secs(20)));
            }
            Stop::Kill => cluster.kill(id),
        }
        tokio::time::sleep(downtime).await;
        cluster.spawn(id);
        let leader = cluster.wait_for_leader(TIMEOUT).await;
        if std::env::var_os("COORD_BENCH_VERBOSE").is_some() {
            eprintln!(
                "  {stop:?} of replica {id} at {:?}: leader now {leader}",
                started.elapsed()
            );
        }
        let at = cluster.status(leader).map_or(0, |s| s.last_log_index);
        cluster.wait_applied(id, at, TIMEOUT).await;
    }
    // Every agent acknowledged after the last restart.
    let ended = Instant::now();
    let deadline = ended + TIMEOUT;
    while Instant::now() < deadline
        && !acks.iter().all(|a| {
            a.lock()
                .is_ok_and(|s| s.0.last().is_some_and(|t| *t > ended))
        })
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    let mut longest = Duration::ZERO;
    let mut failed = 0;
    for a in &acks {
        let Ok(s) = a.lock() else { continue };
        failed += s.1;
        let mut prev = started;
        for t in s.0.iter().filter(|t| **t >= started) {
            longest = longest.max(t.duration_since(prev));
            prev = *t;
        }
    }
    Restart {
        longest_stall: longest,
        failed,
    }
}

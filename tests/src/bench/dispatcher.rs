//! `coord-bench dispatcher`: coord's replicated tf.data dispatcher against TensorFlow's own
//! (fault-tolerant mode, one journal fsync per update) in the same run.
//!
//! - **GetSplit throughput**: DYNAMIC sharding of `range(splits)`, one split per element, `W`
//!   workers. Measured two ways on coord: the dispatcher alone (W tasks asking for splits in a
//!   closed loop, each reporting its previous split delivered), and end to end (W `data-worker`
//!   processes and one consumer, the same shape as TF's measurement). Every split is checked to be
//!   handed out exactly once.
//! - **Restore**: a journal of N updates (N GetSplits), every replica killed, all restarted;
//!   timed from the restart until the dispatcher answers with the job at its position. Snapshots
//!   keep this flat as N grows; TF replays its whole journal. Measured on both Raft log engines
//!   (`--raft-log segments` and `sled`), each N on a fresh ensemble of each, in the same run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_agent::data::DispatchClient;
use coord_proto::coord::dispatcher as pb;
use coord_proto::dataset::range;

use super::coord_target::RaftLog;
use super::{disk_usage, mb};
use crate::cluster::Cluster;
use crate::data::{consumer, dispatch_client, job, read_values, WorkerProc};
use crate::tfdata::TfPeer;
use crate::ClusterOptions;

/// Splits per GetSplit in the leased runs (what `data-worker` asks for).
const LEASE: u32 = 8;

#[derive(Clone, Debug)]
pub struct Args {
    pub workers: Vec<usize>,
    pub splits: u64,
    pub restore_updates: Vec<u64>,
    /// Measure coord only.
    pub no_tf: bool,
    /// Skip the end-to-end runs with data-worker processes.
    pub no_e2e: bool,
}

fn ensemble() -> Cluster {
    ensemble_logging("warn", RaftLog::Segments)
}

fn ensemble_logging(filter: &str, engine: RaftLog) -> Cluster {
    // Simulated workers never heartbeat: never declare them dead.
    // Three replicas share two cores (as in `coord-bench kv`).
    let mut extra_args: Vec<String> = [
        "--dispatcher-worker-timeout-ms",
        "3600000",
        "--worker-threads",
        "1",
    ]
    .map(String::from)
    .into();
    extra_args.extend(engine.args());
    Cluster::start(ClusterOptions {
        extra_args,
        log_filter: filter.into(),
        ..ClusterOptions::default()
    })
}

/// A fresh job of `splits` one-element splits with one task per simulated worker.
async fn simulated_job(
    d: &DispatchClient,
    workers: usize,
    splits: u64,
    tag: &str,
    name: &str,
) -> Result<Vec<u64>, String> {
    for w in 0..workers {
        d.worker_heartbeat(pb::WorkerHeartbeatRequest {
            worker_address: format!("sim-{tag}-{w}:1"),
            current_tasks: vec![],
        })
        .await
        .map_err(|e| e.to_string())?;
    }
    let (job, _) = job(
        d,
        range(0, splits as i64),
        pb::ProcessingMode::Dynamic,
        Some(name),
        None,
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut all = Vec::new();
    for w in 0..workers {
        let r = d
            .worker_heartbeat(pb::WorkerHeartbeatRequest {
                worker_address: format!("sim-{tag}-{w}:1"),
                current_tasks: vec![],
            })
            .await
            .map_err(|e| e.to_string())?;
        all.extend(
            r.new_tasks
                .iter()
                .filter(|t| t.job_id == job)
                .map(|t| t.task_id),
        );
    }
    if all.len() != workers {
        return Err(format!("job {job} has {} tasks, want {workers}", all.len()));
    }
    Ok(all)
}

/// W closed loops of GetSplit until the end of splits; returns splits/s, after checking that
/// every split came out exactly once.
async fn get_split_loops(
    endpoints: &[String],
    tasks: Vec<u64>,
    splits: u64,
    lease: u32,
) -> Result<f64, String> {
    let seen: Arc<Vec<AtomicU64>> = Arc::new(
        (0..splits.div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect(),
    );
    let dups = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut loops = Vec::new();
    for task in tasks {
        let d = dispatch_client(endpoints);
        let (seen, dups) = (seen.clone(), dups.clone());
        loops.push(tokio::spawn(async move {
            d.coord().find_leader().await;
            let mut done = Vec::new();
            loop {
                let r = d
                    .get_split(pb::GetSplitRequest {
                        task_id: task,
                        splits_done: std::mem::take(&mut done),
                        max_splits: lease,
                    })
                    .await
                    .map_err(|e| format!("GetSplit for task {task}: {e}"))?;
                if !r.splits.is_empty() {
                    for s in r.splits {
                        let bit = 1u64 << (s % 64);
                        if seen[(s / 64) as usize].fetch_or(bit, Ordering::Relaxed) & bit != 0 {
                            dups.fetch_add(1, Ordering::Relaxed);
                        }
                        done.push(s);
                    }
                } else if r.retry {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                } else {
                    return Ok::<(), String>(());
                }
            }
        }));
    }
    for l in loops {
        l.await.map_err(|e| e.to_string())??;
    }
    let secs = started.elapsed().as_secs_f64();
    let handed: u64 = seen
        .iter()
        .map(|w| u64::from(w.load(Ordering::Relaxed).count_ones()))
        .sum();
    if handed != splits || dups.load(Ordering::Relaxed) != 0 {
        return Err(format!(
            "{handed} of {splits} splits handed out, {} twice",
            dups.load(Ordering::Relaxed)
        ));
    }
    Ok(splits as f64 / secs)
}

/// W data-worker processes and one consumer read `range(splits)`; elements/s.
async fn end_to_end(cluster: &Cluster, workers: usize, splits: u64) -> Result<f64, String> {
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let procs: Vec<WorkerProc> = (0..workers).map(|_| WorkerProc::start(&eps, 200)).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alive = d
            .get_workers(pb::GetWorkersRequest {})
            .await
            .map(|r| {
                r.workers
                    .iter()
                    .filter(|w| w.alive && !w.address.starts_with("sim-"))
                    .count()
            })
            .unwrap_or(0);
        if alive >= workers {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{alive} of {workers} data workers registered"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (j, c) = job(
        &d,
        range(0, splits as i64),
        pb::ProcessingMode::Dynamic,
        None,
        None,
    )
    .await
    .map_err(|e| e.to_string())?;
    let mut r = consumer(&d, j, c, false, None).await;
    let started = Instant::now();
    let values = read_values(&mut r, usize::MAX)
        .await
        .map_err(|e| e.to_string())?;
    let secs = started.elapsed().as_secs_f64();
    let mut sorted = values.clone();
    sorted.sort_unstable();
    if sorted != (0..splits as i64).collect::<Vec<_>>() {
        return Err(format!(
            "end to end: {} elements, not exactly 0..{splits}",
            values.len()
        ));
    }
    drop(procs);
    Ok(splits as f64 / secs)
}

/// What a full restart after `updates` journaled GetSplits cost.
pub struct Restore {
    /// From spawning the replicas until the first one has rebuilt its state from disk (its
    /// `/status` shows the pre-crash applied index): TF's "replayed the journal" point.
    pub state_restored: f64,
    /// Until the ensemble has a leader that answers with the job at its position.
    pub serving: f64,
    /// One replica's data directory, on disk (as `du` counts it).
    pub bytes: u64,
}

/// Journals `updates` GetSplits on an ensemble on `engine`, kills every replica, restarts them
/// all.
async fn restore(updates: u64, engine: RaftLog) -> Result<Restore, String> {
    // Info logs: the restart's phases are read back from them.
    let mut cluster = ensemble_logging("info,openraft=warn,h2=warn", engine);
    let eps = cluster.endpoints();
    cluster_ready(&eps).await?;
    let d = dispatch_client(&eps);
    let tasks = simulated_job(&d, 16, updates, "restore", "restore").await?;
    let rate = get_split_loops(&eps, tasks, updates, 1).await?;
    eprintln!(
        "  {}: journaled {updates} GetSplits at {rate:.0}/s",
        engine.name()
    );
    let applied = cluster
        .ids()
        .iter()
        .filter_map(|&id| cluster.status(id))
        .map(|s| s.last_applied)
        .max()
        .unwrap_or(0);
    for id in cluster.ids() {
        cluster.kill(id);
    }
    let bytes = disk_usage(&cluster.replica(1).data_dir).on_disk;
    let logged_before: Vec<usize> = cluster
        .ids()
        .iter()
        .map(|&id| cluster.log(id).len())
        .collect();
    let spawned_at = std::time::SystemTime::now();
    let started = Instant::now();
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    let mut state_restored = None;
    let d = dispatch_client(&eps);
    loop {
        if state_restored.is_none()
            && cluster.ids().iter().any(|&id| {
                cluster
                    .status(id)
                    .is_some_and(|s| s.last_applied >= applied)
            })
        {
            state_restored = Some(started.elapsed().as_secs_f64());
        }
        if let Some(restored) = state_restored {
            if let Ok(r) = d.list_jobs(pb::ListJobsRequest {}).await {
                if r.jobs.iter().any(|j| j.next_split == updates) {
                    for (i, &id) in cluster.ids().iter().enumerate() {
                        let log = cluster.log(id);
                        let dir = &cluster.replica(id).data_dir;
                        eprintln!(
                            "  {} replica {id}: {} ({} log, {} snapshot)",
                            engine.name(),
                            phases(&log[logged_before[i].min(log.len())..], spawned_at),
                            mb(disk_usage(&dir.join("raft")).on_disk),
                            mb(disk_usage(&dir.join("snapshots")).on_disk),
                        );
                    }
                    return Ok(Restore {
                        state_restored: restored,
                        serving: started.elapsed().as_secs_f64(),
                        bytes,
                    });
                }
            }
        }
        if started.elapsed() > Duration::from_secs(300) {
            return Err("the dispatcher did not come back within 300 s".into());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// When the restarted replica logged its first line, opened its storage ("log at start") and
/// served ("replica serving"), in ms after `spawned`.
fn phases(log: &str, spawned: std::time::SystemTime) -> String {
    let at = |needle: &str| -> Option<f64> {
        let line = log.lines().find(|l| l.contains(needle))?;
        let ts = line.split_whitespace().next()?;
        // 2026-11-22T03:57:22.615526Z: seconds of the day are enough within one run.
        let hms = ts.split('T').nth(1)?.trim_end_matches('Z');
        let mut p = hms.split(':');
        let (h, m, sec): (f64, f64, f64) = (
            p.next()?.parse().ok()?,
            p.next()?.parse().ok()?,
            p.next()?.parse().ok()?,
        );
        let of_day = h * 3600.0 + m * 60.0 + sec;
        let spawned = spawned
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_secs_f64()
            % 86_400.0;
        Some((of_day - spawned) * 1000.0)
    };
    let show = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.0} ms"));
    format!(
        "first log line {}, storage open {}, serving {}",
        show(
            log.lines()
                .next()
                .and_then(|l| at(l.get(..27).unwrap_or(l)))
        ),
        show(at("log at start")),
        show(at("replica serving"))
    )
}

pub async fn run(args: Args) -> Result<(), String> {
    let tf = if args.no_tf {
        Err("--no-tf".to_string())
    } else {
        eprintln!("coord-bench dispatcher: preparing TensorFlow's tf.data service (a venv, once)");
        tokio::task::spawn_blocking(TfPeer::get)
            .await
            .map_err(|e| e.to_string())?
            .map(Arc::new)
    };
    if let Err(why) = &tf {
        eprintln!("coord-bench dispatcher: no TF peer: {why}");
    }
    println!(
        "\n| DYNAMIC sharding, {} one-element splits | coord: dispatcher alone, 1 split per GetSplit | coord: dispatcher alone, {LEASE} per GetSplit | coord: end to end | TF tf.data service: end to end | coord e2e / TF | target |",
        args.splits
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for &w in args.workers.iter().filter(|w| **w > 0) {
        let cluster = ensemble();
        let eps = cluster.endpoints();
        cluster_ready(&eps).await?;
        let d = dispatch_client(&eps);
        let tag = format!("w{w}");
        let tasks = simulated_job(&d, w, args.splits, &tag, &tag).await?;
        let alone = get_split_loops(&eps, tasks, args.splits, 1).await?;
        eprintln!(
            "  coord, {w} workers, dispatcher alone, 1 split per GetSplit: {alone:.0} splits/s"
        );
        let tasks = simulated_job(&d, w, args.splits, &tag, &format!("{tag}-lease")).await?;
        let leased = get_split_loops(&eps, tasks, args.splits, LEASE).await?;
        eprintln!("  coord, {w} workers, dispatcher alone, {LEASE} splits per GetSplit: {leased:.0} splits/s");
        // An anchor inside the same run: the same ensemble's key-value writes at W clients.
        let target = Arc::new(super::coord_target::CoordTarget::connect(eps.clone(), w).await?);
        let put = super::load::run(
            target,
            super::load::OpKind::Put,
            w,
            args.splits as usize / 4,
        )
        .await;
        eprintln!(
            "  coord, {w} clients, key-value put on the same ensemble: {:.0}/s (p50 {:?})",
            put.ops_per_sec(),
            put.p50
        );
        drop(cluster);
        let e2e = if args.no_e2e {
            None
        } else {
            // A fresh ensemble: the simulated workers above would get tasks of this job too.
            let cluster = ensemble();
            cluster_ready(&cluster.endpoints()).await?;
            let r = end_to_end(&cluster, w, args.splits).await?;
            eprintln!("  coord, {w} workers, end to end: {r:.0} splits/s");
            Some(r)
        };
        let peer = match &tf {
            Ok(p) => {
                let (p, splits) = (p.clone(), args.splits);
                let r = tokio::task::spawn_blocking(move || p.split_throughput(w, splits))
                    .await
                    .map_err(|e| e.to_string())??;
                eprintln!("  TF, {w} workers: {:.0} splits/s", r.splits_per_sec);
                Some(r.splits_per_sec)
            }
            Err(_) => None,
        };
        let f = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.0}/s"));
        let ratio = match (e2e, peer) {
            (Some(a), Some(b)) => format!("{:.2}×", a / b),
            _ => "–".into(),
        };
        println!(
            "| {w} workers | {alone:.0}/s | {leased:.0}/s | {} | {} | {ratio} | {} |",
            f(e2e),
            f(peer),
            if w == 16 { "≥ 2×" } else { "" }
        );
    }
    let (mut head, mut ratios) = (String::new(), String::new());
    for e in RaftLog::ALL.map(RaftLog::name) {
        head += &format!(" {e}: state rebuilt | {e}: serving again | {e} data dir |");
        ratios += &format!(" {e} state / TF |");
    }
    println!(
        "\n| restore after a full restart |{head} TF: restored and serving | TF journal |{ratios}"
    );
    // Three columns and a ratio per engine, and TF's two.
    println!("|---|{}", "---:|".repeat(4 * RaftLog::ALL.len() + 2));
    for &n in args.restore_updates.iter().filter(|n| **n > 0) {
        let mut engines = Vec::new();
        for engine in RaftLog::ALL {
            let r = restore(n, engine).await?;
            eprintln!(
                "  coord on {} after {n} updates: state rebuilt in {:.3} s, serving in {:.3} s, data directory {}",
                engine.name(),
                r.state_restored,
                r.serving,
                mb(r.bytes)
            );
            engines.push(r);
        }
        let peer = match &tf {
            Ok(p) => {
                let p = p.clone();
                Some(
                    tokio::task::spawn_blocking(move || p.restore(n))
                        .await
                        .map_err(|e| e.to_string())??,
                )
            }
            Err(_) => None,
        };
        let (tf_secs, tf_bytes) = match &peer {
            Some(p) => (format!("{:.3} s", p.restore_seconds), mb(p.journal_bytes)),
            None => ("–".into(), "–".into()),
        };
        let mut cells = String::new();
        for r in &engines {
            cells += &format!(
                " {:.3} s | {:.3} s | {} |",
                r.state_restored,
                r.serving,
                mb(r.bytes)
            );
        }
        let mut ratios = String::new();
        for r in &engines {
            ratios += &match &peer {
                Some(p) => format!(" {:.2}× |", r.state_restored / p.restore_seconds),
                None => " – |".into(),
            };
        }
        println!("| {n} journaled updates |{cells} {tf_secs} | {tf_bytes} |{ratios}");
    }
    Ok(())
}

async fn cluster_ready(eps: &[String]) -> Result<(), String> {
    let d = dispatch_client(eps);
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.list_jobs(pb::ListJobsRequest {}).await.is_err() {
        if Instant::now() > deadline {
            return Err("the ensemble did not come up".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

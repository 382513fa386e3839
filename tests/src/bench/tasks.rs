//! Many tasks against one ensemble: registration, WaitForAllTasks and one barrier across all of
//! them, with every task heartbeating once a second, as a large training job does. Measures what
//! the leader pays for it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use futures::stream::{self, StreamExt};

/// What the run measured.
#[derive(Debug, Clone)]
pub struct TasksReport {
    pub tasks: usize,
    pub register: Duration,
    pub wait_for_all: Duration,
    /// From the moment the last task arrived at the barrier to the moment every task's call
    /// returned.
    pub barrier_release: Duration,
    /// Leader CPU, in cores, while the tasks only heartbeat.
    pub heartbeat_cpu_cores: f64,
    pub leader_rss_before: u64,
    /// All tasks registered and heartbeating, nothing parked.
    pub leader_rss_registered: u64,
    /// And every task but one parked at the barrier.
    pub leader_rss_after: u64,
    pub heartbeat_errors: u64,
}

impl TasksReport {
    pub fn rss_per_registered_task(&self) -> f64 {
        self.leader_rss_registered
            .saturating_sub(self.leader_rss_before) as f64
            / self.tasks as f64
    }

    pub fn rss_per_task(&self) -> f64 {
        self.leader_rss_after.saturating_sub(self.leader_rss_before) as f64 / self.tasks as f64
    }
}

/// CPU time (user + system) of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Resident memory of a process, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

fn task(i: usize) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: i32::try_from(i).unwrap_or(i32::MAX),
        recoverable: false,
    }
}

/// Runs the whole scenario against an ensemble configured with `--job worker=<tasks>`, whose
/// leader runs as process `leader_pid`; `parked` reports how many calls the leader has parked.
pub async fn run(
    endpoints: Vec<String>,
    tasks: usize,
    connections: usize,
    leader_pid: u32,
    parked: impl Fn() -> u64,
) -> Result<TasksReport, String> {
    let clients: Vec<CoordClient> = (0..connections.max(1))
        .map(|_| CoordClient::new(ClientOptions::new(endpoints.clone())).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for c in &clients {
        c.find_leader().await.ok_or("no leader")?;
    }
    let client = |i: usize| clients[i % clients.len()].clone();
    let rss_before = rss_bytes(leader_pid).unwrap_or(0);

    let started = Instant::now();
    let results: Vec<Result<u64, String>> = stream::iter(0..tasks)
        .map(|i| {
            let c = client(i);
            async move {
                c.register_task(&task(i), i as u64 + 1)
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .buffer_unordered(512)
        .collect()
        .await;
    if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
        return Err(format!("registration failed: {e}"));
    }
    let register = started.elapsed();
    eprintln!("registered {tasks} tasks in {register:?}");

    // Every task heartbeats once a second, spread over the second.
    let stop = Arc::new(AtomicBool::new(false));
    let heartbeat_errors = Arc::new(AtomicU64::new(0));
    let beats: Vec<_> = (0..tasks)
        .map(|i| {
            let (c, stop, errors) = (client(i), stop.clone(), heartbeat_errors.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis((i % 1000) as u64)).await;
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    if c.heartbeat(&task(i), i as u64 + 1).await.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu0 = cpu_seconds(leader_pid).unwrap_or(0.0);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let heartbeat_cpu_cores =
        (cpu_seconds(leader_pid).unwrap_or(0.0) - cpu0) / t0.elapsed().as_secs_f64();
    let leader_rss_registered = rss_bytes(leader_pid).unwrap_or(0);
    eprintln!("heartbeats only: leader uses {heartbeat_cpu_cores:.2} cores");

    let started = Instant::now();
    let waits: Vec<_> = (0..tasks)
        .map(|i| {
            let c = client(i);
            tokio::spawn(async move { c.wait_for_all_tasks(&task(i), None).await.map(|_| ()) })
        })
        .collect();
    for w in waits {
        w.await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("wait for all: {e}"))?;
    }
    let wait_for_all = started.elapsed();
    eprintln!("WaitForAllTasks returned for all {tasks} in {wait_for_all:?}");

    // All but one task arrive and park; then the last arrives and the clock runs until every
    // call has returned.
    let arrive = |i: usize| {
        let c = client(i);
        tokio::spawn(async move {
            c.barrier("bench-barrier", 0, Duration::from_secs(600), &[], &task(i))
                .await
                .map(|_| Instant::now())
        })
    };
    let early: Vec<_> = (0..tasks - 1).map(arrive).collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    while parked() < (tasks - 1) as u64 {
        if let Some(done) = early.iter().position(|h| h.is_finished()) {
            let early_result = early
                .into_iter()
                .nth(done)
                .ok_or("lost a barrier call")?
                .await;
            return Err(format!(
                "a barrier call returned before the last arrival: {early_result:?}"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {} barrier calls parked",
                parked(),
                tasks - 1
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let leader_rss_after = rss_bytes(leader_pid).unwrap_or(0);
    let last_arrival = Instant::now();
    let last = arrive(tasks - 1);
    let mut released = Vec::with_capacity(tasks);
    for a in early.into_iter().chain(std::iter::once(last)) {
        released.push(
            a.await
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("barrier: {e}"))?,
        );
    }
    let barrier_release = released
        .iter()
        .max()
        .map_or(Duration::ZERO, |t| t.duration_since(last_arrival));
    stop.store(true, Ordering::Relaxed);
    for b in beats {
        b.abort();
    }
    Ok(TasksReport {
        tasks,
        register,
        wait_for_all,
        barrier_release,
        heartbeat_cpu_cores,
        leader_rss_before: rss_before,
        leader_rss_registered,
        leader_rss_after,
        heartbeat_errors: heartbeat_errors.load(Ordering::Relaxed),
    })
}

struct ReportArgs {
    tasks: usize,
    connections: usize,
}

/// Runs the `coord-bench tasks` benchmark on a fresh ensemble and prints its table.
pub async fn report(tasks: usize, connections: usize) -> Result<(), String> {
    let args = ReportArgs { tasks, connections };
    let job = format!("worker={}", args.tasks);
    let mut cluster = crate::Cluster::start(crate::ClusterOptions {
        extra_args: vec![
            "--worker-threads".into(),
            "1".into(),
            "--job".into(),
            job,
            "--heartbeat-timeout-ms".into(),
            "10000".into(),
        ],
        log_filter: "warn".into(),
        ..crate::ClusterOptions::default()
    });
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let pid = cluster.pid(leader).ok_or("leader has no process")?;
    let term_before = cluster.status(leader).map_or(0, |s| s.term);
    // Parked calls on whichever replica leads now (summed: only the leader parks any).
    let https: Vec<std::net::SocketAddr> = cluster
        .ids()
        .iter()
        .map(|&id| cluster.replica(id).http)
        .collect();
    let parked = move || {
        https
            .iter()
            .filter_map(|&http| crate::http::get(http, "/metrics").ok())
            .filter_map(|(_, m)| {
                m.lines()
                    .find_map(|l| l.strip_prefix("coord_parked_calls "))
                    .and_then(|v| v.trim().parse::<f64>().ok())
            })
            .map(|v| v as u64)
            .sum::<u64>()
    };
    eprintln!(
        "coord-bench tasks: {} tasks over {} connections, heartbeat every 1 s, leader is replica {leader}",
        args.tasks, args.connections
    );
    let r = run(
        cluster.endpoints(),
        args.tasks,
        args.connections,
        pid,
        parked,
    )
    .await?;
    let after = cluster.status(leader);
    let still_leader = after.as_ref().and_then(|s| s.leader_id) == Some(leader);
    let elections = after.map_or(0, |s| s.term.saturating_sub(term_before));
    println!(
        "\n| measure ({} tasks, 3 replicas) | value | target |",
        r.tasks
    );
    println!("|---|---:|---:|");
    println!(
        "| register all tasks | {:.2} s ({:.0} tasks/s) | |",
        r.register.as_secs_f64(),
        r.tasks as f64 / r.register.as_secs_f64()
    );
    println!(
        "| WaitForAllTasks, all tasks | {:.2} s | |",
        r.wait_for_all.as_secs_f64()
    );
    println!(
        "| barrier released after the last arrival | {} ms | <= 200 ms |",
        r.barrier_release.as_millis()
    );
    println!(
        "| leader CPU with every task heartbeating | {:.2} cores | < 1 core |",
        r.heartbeat_cpu_cores
    );
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "| leader RSS growth, all tasks registered and heartbeating | {:.1} MiB -> {:.1} MiB = {:.0} B/task | <= 2048 B/task |",
        mib(r.leader_rss_before),
        mib(r.leader_rss_registered),
        r.rss_per_registered_task()
    );
    println!(
        "| ... and every task's Barrier call parked on the leader | {:.1} MiB = {:.0} B/task | |",
        mib(r.leader_rss_after),
        r.rss_per_task()
    );
    println!("| failed heartbeats | {} | 0 |", r.heartbeat_errors);
    println!(
        "| leader unchanged during the run (elections: {elections}) | {still_leader} | true |"
    );
    Ok(())
}

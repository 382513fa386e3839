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
    /// WaitForAllTasks: from the last task's call to every task's answer.
    pub wait_for_all: Duration,
    /// Bytes of every WaitForAllTasks answer together.
    pub wait_for_all_bytes: u64,
    /// Bytes of each task's device (one `DeviceAttributes`; 0 = no devices).
    pub device_bytes: usize,
    /// Leader RSS with every task's WaitForAllTasks call but one parked.
    pub leader_rss_waits_parked: u64,
    /// From the moment the last task arrived at the barrier to the moment every task's call
    /// returned.
    pub barrier_release: Duration,
    /// Leader CPU, in cores, while the tasks only heartbeat.
    pub heartbeat_cpu_cores: f64,
    pub leader_rss_before: u64,
    /// All tasks registered and heartbeating, nothing parked.
    pub leader_rss_registered: u64,
    /// After WaitForAllTasks, just before the barrier: the base the parked calls are measured
    /// from (what the answers before left in the allocator is not theirs).
    pub leader_rss_before_barrier: u64,
    /// And every task but one parked at the barrier.
    pub leader_rss_after: u64,
    pub heartbeat_errors: u64,
    /// After a kill -9 of the leader: the longest any task went between two answered heartbeats,
    /// less the heartbeat interval (the stall the kill caused it).
    pub kill_stall: Duration,
    /// Heartbeats that failed after the kill (a task declared dead fails every later one).
    pub heartbeat_errors_after_kill: u64,
}

impl TasksReport {
    pub fn rss_per_registered_task(&self) -> f64 {
        self.leader_rss_registered
            .saturating_sub(self.leader_rss_before) as f64
            / self.tasks as f64
    }

    /// What each parked WaitForAllTasks call adds to the leader (measured after the barrier).
    pub fn rss_per_parked_wait(&self) -> f64 {
        self.leader_rss_waits_parked
            .saturating_sub(self.leader_rss_after) as f64
            / self.tasks.saturating_sub(1).max(1) as f64
    }

    /// What each parked barrier call adds to the leader.
    pub fn rss_per_parked_call(&self) -> f64 {
        self.leader_rss_after
            .saturating_sub(self.leader_rss_before_barrier) as f64
            / self.tasks.saturating_sub(1).max(1) as f64
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

/// Waits until `parked()` reaches `count` with the calls in `calls` still running; a call that
/// returns first fails the run.
async fn parked_until<T: std::fmt::Debug>(
    calls: Vec<tokio::task::JoinHandle<T>>,
    parked: impl Fn() -> u64,
    count: u64,
    what: &str,
) -> Result<Vec<tokio::task::JoinHandle<T>>, String> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while parked() < count {
        if let Some(done) = calls.iter().position(|h| h.is_finished()) {
            let early = calls.into_iter().nth(done).ok_or("lost a call")?.await;
            return Err(format!(
                "a {what} call returned before the last task's: {early:?}"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!("only {} of {count} calls parked", parked()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(calls)
}

/// The type URL TensorFlow packs each device's `DeviceAttributes` under.
const DEVICE_ATTRIBUTES_URL: &str = "type.googleapis.com/tensorflow.DeviceAttributes";

/// Task `i`'s WaitForAllTasks as TF 2.21 sends it (its device list always present): one CPU
/// device of about `device_bytes` bytes (a `DeviceAttributes` with its name, type, memory limit,
/// incarnation and a description padded to the size), or none.
fn wait_request(i: usize, device_bytes: usize) -> tf::WaitForAllTasksRequest {
    use prost::encoding::{fixed64, int64, string};
    let device = (device_bytes > 0).then(|| {
        let mut value = Vec::with_capacity(device_bytes);
        string::encode(
            1,
            &format!("/job:worker/replica:0/task:{i}/device:CPU:0"),
            &mut value,
        );
        string::encode(2, &"CPU".to_string(), &mut value);
        int64::encode(4, &(1_i64 << 34), &mut value);
        fixed64::encode(6, &(0x9e37_79b9_7f4a_7c15_u64 ^ i as u64), &mut value);
        let pad = device_bytes.saturating_sub(value.len() + 3);
        string::encode(7, &"x".repeat(pad), &mut value);
        tf::AnyMessage {
            type_url: DEVICE_ATTRIBUTES_URL.into(),
            value: value.into(),
        }
    });
    tf::WaitForAllTasksRequest {
        source_task: Some(task(i)),
        device_info: Some(tf::DeviceInfo {
            device: device.into_iter().collect(),
        }),
        local_device_info: None,
    }
}

/// Whether the simulated tasks accept gzip answers, as TensorFlow's and jaxlib's gRPC clients do.
static ACCEPT_GZIP: AtomicBool = AtomicBool::new(true);

/// WaitForAllTasks on `ch`, keeping only the answer's size: a load generator that decoded every
/// device of every answer (N² of them) would measure itself.
async fn answer_size(
    ch: coord_proto::conn::EagerEnd<tonic::transport::Channel>,
    req: tonic::Request<tf::WaitForAllTasksRequest>,
) -> Result<tonic::Response<usize>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(ch).max_decoding_message_size(usize::MAX);
    if ACCEPT_GZIP.load(Ordering::Relaxed) {
        grpc = grpc.accept_compressed(tonic::codec::CompressionEncoding::Gzip);
    }
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/tensorflow.CoordinationService/WaitForAllTasks",
    );
    grpc.unary(req, path, SizeCodec).await
}

/// Encodes a WaitForAllTasks request; decodes an answer to its size.
#[derive(Clone, Copy, Default)]
struct SizeCodec;

struct SizeDecoder;

impl tonic::codec::Decoder for SizeDecoder {
    type Item = usize;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<usize>, tonic::Status> {
        use bytes::Buf;
        let n = src.remaining();
        src.advance(n);
        Ok(Some(n))
    }
}

impl tonic::codec::Codec for SizeCodec {
    type Encode = tf::WaitForAllTasksRequest;
    type Decode = usize;
    type Encoder = <tonic_prost::ProstCodec<tf::WaitForAllTasksRequest, tf::WaitForAllTasksResponse> as tonic::codec::Codec>::Encoder;
    type Decoder = SizeDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        tonic_prost::ProstCodec::<tf::WaitForAllTasksRequest, tf::WaitForAllTasksResponse>::default(
        )
        .encoder()
    }

    fn decoder(&mut self) -> Self::Decoder {
        SizeDecoder
    }
}

/// The simulated job.
#[derive(Clone, Debug)]
pub struct Load {
    pub tasks: usize,
    /// Connections the tasks share, as sidecars carrying several tasks each would.
    pub connections: usize,
    /// Bytes of each task's one device (0: none).
    pub device_bytes: usize,
    /// Each task heartbeats this often.
    pub heartbeat_every: Duration,
    /// Leader CPU is read over this long, with the tasks only heartbeating.
    pub cpu_window: Duration,
}

/// Runs the whole scenario against an ensemble configured with `--job worker=<tasks>`, whose
/// leader runs as process `leader_pid`; `parked` reports how many calls the leader has parked.
pub async fn run(
    endpoints: Vec<String>,
    load: &Load,
    leader_pid: u32,
    parked: impl Fn() -> u64,
    kill_leader: impl FnOnce(),
) -> Result<TasksReport, String> {
    let Load {
        tasks,
        connections,
        device_bytes,
        heartbeat_every,
        cpu_window,
    } = load.clone();
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
    // The longest gap between two answered heartbeats of any task, in ms, since the last reset.
    let longest_gap = Arc::new(AtomicU64::new(0));
    let beats: Vec<_> = (0..tasks)
        .map(|i| {
            let (c, stop, errors, gap) = (
                client(i),
                stop.clone(),
                heartbeat_errors.clone(),
                longest_gap.clone(),
            );
            tokio::spawn(async move {
                // Spread over the interval, as independent tasks' heartbeats are.
                tokio::time::sleep(heartbeat_every.mul_f64((i % 1000) as f64 / 1000.0)).await;
                let mut tick = tokio::time::interval(heartbeat_every);
                let mut answered = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    if c.heartbeat(&task(i), i as u64 + 1).await.is_err() {
                        errors.fetch_add(1, Ordering::Relaxed);
                    } else {
                        let ms = answered.elapsed().as_millis() as u64;
                        gap.fetch_max(ms, Ordering::Relaxed);
                        answered = Instant::now();
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu0 = cpu_seconds(leader_pid).unwrap_or(0.0);
    let t0 = Instant::now();
    tokio::time::sleep(cpu_window).await;
    let heartbeat_cpu_cores =
        (cpu_seconds(leader_pid).unwrap_or(0.0) - cpu0) / t0.elapsed().as_secs_f64();
    let leader_rss_registered = rss_bytes(leader_pid).unwrap_or(0);
    eprintln!("heartbeats only: leader uses {heartbeat_cpu_cores:.2} cores");

    // All but one task arrive at a barrier and park; then all but one call WaitForAllTasks
    // and park too (the heap growing from the barrier's, so neither reuses what the other freed).
    // Then the last task calls WaitForAllTasks, then arrives at the barrier; each is timed from
    // that call until every task's call has returned.
    let arrive = |i: usize| {
        let c = client(i);
        tokio::spawn(async move {
            c.barrier("bench-barrier", 0, Duration::from_secs(600), &[], &task(i))
                .await
                .map(|_| Instant::now())
        })
    };
    let leader_rss_before_barrier = rss_bytes(leader_pid).unwrap_or(0);
    let early = (0..tasks - 1).map(arrive).collect();
    let early = parked_until(early, &parked, (tasks - 1) as u64, "barrier").await?;
    let leader_rss_after = rss_bytes(leader_pid).unwrap_or(0);

    let wait = |i: usize| {
        let c = client(i);
        let req = wait_request(i, device_bytes);
        tokio::spawn(async move {
            let bytes = c
                .forward(
                    req,
                    true,
                    true,
                    |ch, r| async move { answer_size(ch, r).await },
                )
                .await?;
            Ok::<_, tonic::Status>((Instant::now(), bytes as u64))
        })
    };
    let waiting = (0..tasks - 1).map(wait).collect();
    let waiting = parked_until(waiting, &parked, 2 * (tasks - 1) as u64, "WaitForAllTasks").await?;
    let leader_rss_waits_parked = rss_bytes(leader_pid).unwrap_or(0);
    let last_call = Instant::now();
    let mut wait_for_all_bytes = 0;
    let mut answered = last_call;
    for w in waiting.into_iter().chain(std::iter::once(wait(tasks - 1))) {
        let (at, bytes) = w
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("wait for all: {e}"))?;
        wait_for_all_bytes += bytes;
        answered = answered.max(at);
    }
    let wait_for_all = answered.duration_since(last_call);
    eprintln!(
        "WaitForAllTasks answered every task {wait_for_all:?} after the last call ({} MB)",
        wait_for_all_bytes / 1_000_000
    );

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
    // kill -9 the leader with every task heartbeating; the tasks' clients fail over.
    let errors_before_kill = heartbeat_errors.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    longest_gap.store(0, Ordering::Relaxed);
    kill_leader();
    // Long enough for every task to heartbeat a few times after the election.
    tokio::time::sleep((heartbeat_every * 3).max(Duration::from_secs(8))).await;
    let kill_stall =
        Duration::from_millis(longest_gap.load(Ordering::Relaxed)).saturating_sub(heartbeat_every);
    let heartbeat_errors_after_kill = heartbeat_errors.load(Ordering::Relaxed) - errors_before_kill;
    eprintln!("leader killed: longest heartbeat stall {kill_stall:?}, {heartbeat_errors_after_kill} failed heartbeats");
    stop.store(true, Ordering::Relaxed);
    for b in beats {
        b.abort();
    }
    Ok(TasksReport {
        tasks,
        register,
        wait_for_all,
        wait_for_all_bytes,
        device_bytes,
        leader_rss_waits_parked,
        barrier_release,
        heartbeat_cpu_cores,
        leader_rss_before: rss_before,
        leader_rss_registered,
        leader_rss_before_barrier,
        leader_rss_after,
        heartbeat_errors: errors_before_kill,
        kill_stall,
        heartbeat_errors_after_kill,
    })
}

/// What `coord-bench tasks` runs.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Simulated tasks.
    #[arg(long, default_value_t = 10_000)]
    pub tasks: usize,
    /// Connections the tasks share (a real job has one per task).
    #[arg(long, default_value_t = 100)]
    pub connections: usize,
    /// Bytes of the one TensorFlow device each task sends with WaitForAllTasks (a CPU device's
    /// `DeviceAttributes` is about 170; 0 = no devices).
    #[arg(long, default_value_t = 170)]
    pub device_bytes: usize,
    /// The tasks do not accept gzip answers (TensorFlow's and jaxlib's clients do).
    #[arg(long)]
    pub no_gzip: bool,
}

/// Runs the `coord-bench tasks` benchmark on a fresh ensemble and prints its table.
pub async fn report(args: Args) -> Result<(), String> {
    ACCEPT_GZIP.store(!args.no_gzip, Ordering::Relaxed);
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
    let load = Load {
        tasks: args.tasks,
        connections: args.connections,
        device_bytes: args.device_bytes,
        heartbeat_every: Duration::from_secs(1),
        cpu_window: Duration::from_secs(10),
    };
    let r = run(cluster.endpoints(), &load, pid, parked, || {
        cluster.kill(leader)
    })
    .await?;
    // Read off a survivor: the leader is dead by now.
    let survivor = cluster.ids().into_iter().find(|&id| id != leader);
    let after = survivor.and_then(|id| cluster.status(id));
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
        "| WaitForAllTasks, one {} B device per task{}: every answer after the last call | {:.2} s ({:.0} MB of answers) | |",
        r.device_bytes,
        if args.no_gzip { "" } else { ", gzip accepted" },
        r.wait_for_all.as_secs_f64(),
        r.wait_for_all_bytes as f64 / 1e6
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
        "| leader RSS growth per parked Barrier call | {:.1} MiB -> {:.1} MiB = {:.0} B/call | <= 4096 B/call |",
        mib(r.leader_rss_before_barrier),
        mib(r.leader_rss_after),
        r.rss_per_parked_call()
    );
    println!(
        "| leader RSS growth per parked WaitForAllTasks call | {:.1} MiB -> {:.1} MiB = {:.0} B/call | <= 4096 B/call |",
        mib(r.leader_rss_after),
        mib(r.leader_rss_waits_parked),
        r.rss_per_parked_wait()
    );
    println!(
        "| failed heartbeats before the kill | {} | 0 |",
        r.heartbeat_errors
    );
    println!(
        "| leader kill -9: longest stall of a task's heartbeats | {} ms | <= 2000 ms |",
        r.kill_stall.as_millis()
    );
    println!(
        "| ... failed heartbeats after the kill (a task declared dead fails them all) | {} | 0 |",
        r.heartbeat_errors_after_kill
    );
    println!("| elections in the run (the kill's only) | {elections} | 1 |");
    Ok(())
}

//! `coord-bench wait-for-all`: a whole job's WaitForAllTasks on coord against TensorFlow's own
//! coordination service, in the same run, at each size.
//!
//! Both services are set up alike. Task 0 is a real TensorFlow 2.21 process
//! (`tests/tf/coordination_host.py`, as the conformance tests run it): against TensorFlow it hosts
//! the service, as MWMS's leader task does; against coord it is a plain task whose service is the
//! ensemble's leader. Its agent registers and calls WaitForAllTasks with its real devices. The
//! load generator plays tasks 1..N over plain gRPC channels to the one service address (no
//! failover client in between, so both get the same calls): it registers them, then starts every
//! task's WaitForAllTasks at once, each with one TensorFlow device of `--device-bytes`, and times
//! from the first call to the last answer. Answers are counted as wire bytes, not decoded (see
//! [`super::tasks`]). Heartbeat timeouts are set long on both, so the phase is all that runs.
//!
//! Then task 1 puts one value holding every simulated task's device, and every task reads it at
//! once with GetKeyValue, as a JAX job's processes read the global topology: timed from the
//! first read to the last answer.

use std::time::{Duration, Instant};

use coord_proto::conn::EagerEnd;
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use futures::stream::{self, StreamExt};
use tonic::transport::{Channel, Endpoint};

use super::tasks::{answer_size, call_size, task, wait_request, Spawned, ACCEPT_GZIP};
use crate::tf::{Tf, Worker};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Job sizes, in tasks (task 0, the TensorFlow process, among them).
    #[arg(long, value_delimiter = ',', default_values_t = [2_000, 10_000])]
    pub sizes: Vec<usize>,
    #[command(flatten)]
    pub job: super::scale::JobShape,
    /// coord's tasks (task 0 among them) call a follower, which relays their calls to the
    /// leader, as they do when the address they were given is a replica that does not lead (or
    /// no longer does, after a failover). TensorFlow's service is one process either way.
    #[arg(long)]
    pub via_follower: bool,
}

/// Heartbeat timeout on both services: nothing heartbeats but task 0's agent.
const HEARTBEAT_TIMEOUT_MS: &str = "600000";

/// One service's run at one size.
#[derive(Clone, Debug)]
struct Phase {
    /// RegisterTask of tasks 1..N, 512 at a time.
    register: Duration,
    /// From the first WaitForAllTasks call to the last answer.
    wait: Duration,
    /// Every answer's bytes, as they crossed the wire.
    bytes: u64,
    /// The service process's resident memory after the phase.
    rss_after: u64,
    /// The value every task then reads.
    value_bytes: usize,
    /// From the first GetKeyValue of it to the last answer.
    read_all: Duration,
    /// Every such answer's bytes, as they crossed the wire.
    read_bytes: u64,
}

pub async fn run(args: Args) -> Result<(), String> {
    ACCEPT_GZIP.store(!args.job.no_gzip, std::sync::atomic::Ordering::Relaxed);
    let tf = Tf::get().map_err(|e| format!("TensorFlow's service cannot run here: {e}"))?;
    let mut rows = Vec::new();
    for &n in &args.sizes {
        if n < 2 {
            return Err(format!("a job of {n} tasks has no simulated task"));
        }
        let connections = (n - 1).div_ceil(args.job.tasks_per_connection.max(1));
        eprintln!("coord-bench wait-for-all: {n} tasks, TensorFlow's own service");
        let theirs = tensorflows(&tf, n, connections, args.job.device_bytes).await?;
        eprintln!("coord-bench wait-for-all: {n} tasks, coord");
        let ours = coords(
            &tf,
            n,
            connections,
            args.job.device_bytes,
            args.via_follower,
        )
        .await?;
        rows.push((n, connections, theirs, ours));
    }
    print(&rows, args.job.device_bytes, args.job.no_gzip);
    Ok(())
}

/// TensorFlow's service, hosted by task 0.
async fn tensorflows(
    tf: &Tf,
    n: usize,
    connections: usize,
    device_bytes: usize,
) -> Result<Phase, String> {
    let addr = format!("127.0.0.1:{}", crate::cluster::free_ports(1)[0]);
    let host = host(tf, &addr, "self", n);
    let pid = host.pid();
    phase(&host, &addr, n, connections, device_bytes, pid, &|| 1).await
}

/// A coord ensemble (`--job worker=N`), the tasks pointed at its leader (or at a follower,
/// `via_follower`).
async fn coords(
    tf: &Tf,
    n: usize,
    connections: usize,
    device_bytes: usize,
    via_follower: bool,
) -> Result<Phase, String> {
    let mut cluster = crate::Cluster::start(crate::ClusterOptions {
        extra_args: vec![
            "--job".into(),
            format!("worker={n}"),
            "--heartbeat-timeout-ms".into(),
            HEARTBEAT_TIMEOUT_MS.into(),
        ],
        log_filter: "warn".into(),
        ..crate::ClusterOptions::default()
    });
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let pid = cluster.pid(leader).ok_or("the leader has no process")?;
    let called = if via_follower {
        cluster.other_than(leader)
    } else {
        leader
    };
    let addr = cluster.replica(called).grpc.to_string();
    let own = format!("127.0.0.1:{}", crate::cluster::free_ports(1)[0]);
    let host = host(tf, &own, &addr, n);
    let term = || cluster.status(leader).map_or(0, |s| s.term);
    let counted = |name: &str| {
        let metric = super::tasks::metric(cluster.replica(called).http, name);
        metric.map_or(0, |n| n as u64)
    };
    let relayed = || {
        [
            "coord_relayed_waits_total",
            "coord_relayed_reads_total",
            "coord_relayed_read_calls_total",
        ]
        .map(&counted)
    };
    let before = relayed();
    let measured = phase(&host, &addr, n, connections, device_bytes, pid, &term).await;
    if via_follower {
        let after = relayed();
        let [waits, reads, read_calls] = [0, 1, 2].map(|i| after[i].saturating_sub(before[i]));
        eprintln!(
            "coord-bench wait-for-all: through follower {called} (leader {leader}): it waited on \
             the leader {waits} times for its callers, and relayed their {reads} blocking \
             GetKeyValue calls in {read_calls} reads"
        );
    }
    measured
}

/// Task 0: `coordination_host.py` at `own`, its service `leader` ("self": it hosts it).
fn host(tf: &Tf, own: &str, leader: &str, n: usize) -> Worker {
    let args: Vec<String> = [
        "--address",
        own,
        "--leader",
        leader,
        "--tasks",
        &n.to_string(),
        "--heartbeat-timeout-ms",
        HEARTBEAT_TIMEOUT_MS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    tf.script("coordination_host.py", &args, 0)
}

/// Registers tasks 1..N at `addr`, waits for task 0's WaitForAllTasks, then times every other
/// task's.
async fn phase(
    host: &Worker,
    addr: &str,
    n: usize,
    connections: usize,
    device_bytes: usize,
    service_pid: u32,
    term: &dyn Fn() -> u64,
) -> Result<Phase, String> {
    // Each step must pass without an election (coord's term starts at 1; TensorFlow's is 1).
    let steady = |step: &str| match term() {
        1 => {
            eprintln!("  {step}: done");
            Ok(())
        }
        t => Err(format!("coord's leader changed during {step} (term {t})")),
    };
    let channels = connect(addr, connections).await?;
    let channel = |i: usize| channels[i % channels.len()].clone();
    // Task 0 registers once TensorFlow has imported and its server is up.
    let deadline = Instant::now() + Duration::from_secs(180);
    while !connected(channel(0), 0).await {
        if Instant::now() > deadline {
            return Err("task 0 (the TensorFlow process) did not register within 180 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Its agent calls WaitForAllTasks right after registering (`ensure_initialized`); neither
    // service tells a waiting call apart from a connected task, so this gives it time to arrive.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let started = Instant::now();
    let registered: Vec<Result<(), String>> = stream::iter(1..n)
        .map(|i| {
            let mut c = CoordinationServiceClient::new(channel(i));
            async move {
                c.register_task(tf::RegisterTaskRequest {
                    incarnation: i as u64 + 1,
                    source_task: Some(task(i)),
                })
                .await
                .map(drop)
                .map_err(|e| format!("RegisterTask of task {i}: {e}"))
            }
        })
        .buffer_unordered(512)
        .collect()
        .await;
    let register = started.elapsed();
    registered.into_iter().collect::<Result<Vec<()>, _>>()?;
    steady("registration")?;

    let requests: Vec<_> = (1..n).map(|i| wait_request(i, device_bytes)).collect();
    let started = Instant::now();
    let calls: Vec<Spawned<_>> = requests
        .into_iter()
        .enumerate()
        .map(|(k, req)| {
            let ch = EagerEnd(channel(k + 1));
            Spawned::new(async move {
                answer_size(ch, tonic::Request::new(req))
                    .await
                    .map(|r| (Instant::now(), r.into_inner() as u64))
            })
        })
        .collect();
    let (wait, bytes) = answered(started, calls, "WaitForAllTasks").await?;
    // TensorFlow's agent saw the whole job come too.
    host.wait_event("ready", Duration::from_secs(120)).await;
    let rss_after = super::tasks::rss_bytes(service_pid).unwrap_or(0);
    steady("WaitForAllTasks")?;
    let (value_bytes, read_all, read_bytes) = shared_value(&channels, n, device_bytes).await?;
    steady("GetKeyValue")?;
    Ok(Phase {
        register,
        wait,
        bytes,
        rss_after,
        value_bytes,
        read_all,
        read_bytes,
    })
}

/// Task 1 puts a value of every simulated task's device (as a JAX job's global topology holds
/// every device), then every task reads it at once with GetKeyValue; from the first read to the
/// last answer, and every answer's bytes on the wire.
async fn shared_value(
    channels: &[Channel],
    n: usize,
    device_bytes: usize,
) -> Result<(usize, Duration, u64), String> {
    let value: Vec<u8> = (1..n)
        .flat_map(|i| {
            wait_request(i, device_bytes.max(1))
                .device_info
                .into_iter()
                .flat_map(|d| d.device)
                .flat_map(|any| any.value.to_vec())
        })
        .collect();
    let size = value.len();
    let channel = |i: usize| channels[i % channels.len()].clone();
    CoordinationServiceClient::new(channel(1))
        .max_encoding_message_size(usize::MAX)
        .insert_key_value(tf::InsertKeyValueRequest {
            kv: Some(tf::KeyValueEntry {
                key: TOPOLOGY_KEY.into(),
                value: value.into(),
            }),
            allow_overwrite: true,
        })
        .await
        .map_err(|e| format!("InsertKeyValue of {size} bytes: {e}"))?;
    let started = Instant::now();
    let reads: Vec<Spawned<_>> = (1..n)
        .map(|i| {
            let ch = EagerEnd(channel(i));
            Spawned::new(async move {
                let req = tonic::Request::new(tf::GetKeyValueRequest {
                    key: TOPOLOGY_KEY.into(),
                });
                call_size(ch, "/tensorflow.CoordinationService/GetKeyValue", req)
                    .await
                    .map(|r| (Instant::now(), r.into_inner() as u64))
            })
        })
        .collect();
    let (took, bytes) = answered(started, reads, "GetKeyValue").await?;
    Ok((size, took, bytes))
}

/// Waits for every call of a phase started at `started`, each answering when it was answered and
/// its bytes; from `started` to the last answer, and all the bytes.
async fn answered(
    started: Instant,
    calls: Vec<Spawned<Result<(Instant, u64), tonic::Status>>>,
    what: &str,
) -> Result<(Duration, u64), String> {
    let mut bytes = 0;
    let mut last = started;
    for c in calls {
        let (at, b) = c.join().await?.map_err(|e| format!("{what}: {e}"))?;
        bytes += b;
        last = last.max(at);
    }
    Ok((last.duration_since(started), bytes))
}

/// The key of the value every task reads.
const TOPOLOGY_KEY: &str = "bench/global_topology";

/// `count` channels to `addr`, with the flow-control windows of coord's own client on both.
async fn connect(addr: &str, count: usize) -> Result<Vec<Channel>, String> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(16 << 20)
            .connect_timeout(Duration::from_secs(5))
            .connect_lazy();
        out.push(ch);
    }
    Ok(out)
}

/// Whether task `i` is connected, per the service's GetTaskState.
async fn connected(ch: Channel, i: usize) -> bool {
    let mut c = CoordinationServiceClient::new(ch);
    let state = c
        .get_task_state(tf::GetTaskStateRequest {
            source_task: vec![task(i)],
        })
        .await;
    state.is_ok_and(|r| {
        r.into_inner()
            .task_state
            .first()
            .is_some_and(|s| s.state == tf::CoordinatedTaskState::TaskstateConnected as i32)
    })
}

fn print(rows: &[(usize, usize, Phase, Phase)], device_bytes: usize, no_gzip: bool) {
    let gzip = if no_gzip { "not offered" } else { "offered" };
    println!();
    println!(
        "WaitForAllTasks of a whole job: one {device_bytes} B TensorFlow device per simulated task, gzip {gzip}; task 0 a TensorFlow 2.21 process"
    );
    println!();
    println!("| tasks | connections | service | register tasks 1..N | WaitForAllTasks, first call to last answer | bytes on the wire | service RSS after | coord / TF |");
    println!("|---:|---:|---|---:|---:|---:|---:|---:|");
    for (n, conns, theirs, ours) in rows {
        let line = |name: &str, p: &Phase, ratio: &str| {
            println!(
                "| {n} | {conns} | {name} | {:.2} s | {:.2} s | {:.0} MB | {:.0} MiB | {ratio} |",
                p.register.as_secs_f64(),
                p.wait.as_secs_f64(),
                p.bytes as f64 / 1e6,
                p.rss_after as f64 / (1 << 20) as f64,
            )
        };
        line("TensorFlow's own", theirs, "");
        let ratio = ours.wait.as_secs_f64() / theirs.wait.as_secs_f64().max(1e-9);
        line("coord (3 replicas)", ours, &format!("{ratio:.2}x"));
    }
    println!();
    println!("Then every simulated task reads one value of all their devices (as a JAX job's processes read its global topology), GetKeyValue all at once:");
    println!();
    println!("| tasks | service | value | GetKeyValue, first call to last answer | bytes on the wire | coord / TF |");
    println!("|---:|---|---:|---:|---:|---:|");
    for (n, _, theirs, ours) in rows {
        let line = |name: &str, p: &Phase, ratio: &str| {
            println!(
                "| {n} | {name} | {:.2} MB | {:.2} s | {:.0} MB | {ratio} |",
                p.value_bytes as f64 / 1e6,
                p.read_all.as_secs_f64(),
                p.read_bytes as f64 / 1e6,
            )
        };
        line("TensorFlow's own", theirs, "");
        let ratio = ours.read_all.as_secs_f64() / theirs.read_all.as_secs_f64().max(1e-9);
        line("coord (3 replicas)", ours, &format!("{ratio:.2}x"));
    }
}

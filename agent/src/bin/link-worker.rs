//! A worker that moves tensors over the rendezvous links, for tests and `coord-bench rendezvous`.
//!
//! It serves its link, publishes the address in the coordination key-value store, watches its
//! peers' heartbeats, and then produces or consumes `--steps` steps of `--tensors` tensors of
//! `--bytes` bytes each, to or from `--partner`. The consumer checks every byte. Lines on stdout
//! (`key value…`) tell the driver what happened:
//!
//! - `LINK <address>` once serving; `WATCHING <n>`, the number of peers (and itself) it watches; `STEP <n>` every 100 steps (consumer);
//! - `PEER_UP <task>` when a watched peer first answers;
//! - `PEER_DEAD <task> <ms since the start> <reason>` when a watched peer is declared dead;
//! - `RECV_ERROR <ms since the start> <error>` when a receive fails (then exit status 3);
//! - `DONE {json}` with counts, rates, latency percentiles and the resident set size.
//!
//! `--raw-pingpong serve|client` is the anchor `coord-bench rendezvous` measures the links against:
//! no runtime, no coordinator, one blocking loopback TCP connection with `TCP_NODELAY`, on which the
//! client writes `--bytes` bytes and the server writes them back. The server prints `LINK
//! <address>`; the client (`--connect <address>`) prints `DONE {json}` with the round trip's
//! percentiles over `--steps` steps after `--warmup` untimed ones, or `RECV_ERROR <error>`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use coord_agent::rendezvous::link::{self, LinkService};
use coord_agent::rendezvous::links::Links;
use coord_agent::rendezvous::peers::{job_tasks, OnPeer, PeerEvent, PeerMonitor, PeerOptions};
use coord_agent::rendezvous::{DType, ParsedKey, RendezvousMgr, Tensor, WorkerSession};
use coord_agent::{Agent, AgentConfig, AgentState, CoordClient};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Role {
    Produce,
    Consume,
    /// Only serve the link and heartbeat peers.
    Idle,
}

#[derive(Parser, Debug)]
struct Cli {
    /// Every coordinator replica, comma-separated.
    #[arg(long, value_delimiter = ',')]
    coordinators: Vec<String>,
    /// TLS toward the ensemble (the worker links stay plain: gRPC and the direct link).
    #[command(flatten)]
    tls: coord_agent::tls::TlsArgs,
    /// The job this worker's task belongs to.
    #[arg(long, default_value = "worker")]
    job: String,
    #[arg(long)]
    task_id: u32,
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Task ids of the job whose heartbeats this worker watches (default: every task of its job,
    /// as the coordination service's cluster configuration lists them).
    #[arg(long, value_delimiter = ',')]
    watch: Option<Vec<u32>>,
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    #[arg(long, default_value_t = 1500)]
    peer_timeout_ms: u64,
    /// Register with the coordination service, and report a dead peer to it.
    #[arg(long)]
    agent: bool,
    #[arg(long, value_enum, default_value = "idle")]
    role: Role,
    /// The task id this worker sends to or receives from.
    #[arg(long, default_value_t = 0)]
    partner: u32,
    #[arg(long, default_value_t = 1)]
    steps: i64,
    #[arg(long, default_value_t = 1)]
    tensors: u32,
    #[arg(long, default_value_t = 4096)]
    bytes: usize,
    /// Run on one thread (lower latency for small tensors; no parallelism).
    #[arg(long)]
    single_thread: bool,
    /// Consumer: receives outstanding at once (1: each receive is one round trip).
    #[arg(long, default_value_t = 1)]
    inflight: i64,
    /// Producer: steps sent ahead of the consumer at most.
    #[arg(long, default_value_t = 16)]
    window: i64,
    /// Instead of the rendezvous, a raw TCP ping-pong of `--bytes`-byte messages (the benchmark's
    /// anchor): `serve` echoes on `--listen`, `client` times `--steps` round trips to `--connect`.
    #[arg(long, value_enum)]
    raw_pingpong: Option<PingPong>,
    /// `--raw-pingpong client`: the server's address.
    #[arg(long, default_value = "")]
    connect: String,
    /// `--raw-pingpong client`: untimed round trips first (connection and caches warm).
    #[arg(long, default_value_t = 1000)]
    warmup: i64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PingPong {
    Serve,
    Client,
}

fn task(job: &str, id: u32) -> String {
    coord_agent::rendezvous::key::task_name(job, 0, id)
}

fn key(cli: &Cli, producer: u32, consumer: u32, step: i64, t: u32) -> Result<ParsedKey, String> {
    ParsedKey::parse(&format!(
        "{}/device:CPU:0;0000000000000001;{}/device:CPU:0;tensor_{t};{step}:0",
        task(&cli.job, producer),
        task(&cli.job, consumer)
    ))
}

/// The bytes of tensor `t` of `step`: cheap to make and to check, different for every tensor.
fn payload(step: i64, t: u32, len: usize) -> Bytes {
    let seed = (step as u64).wrapping_mul(31).wrapping_add(t as u64) as u8;
    Bytes::from(
        (0..len)
            .map(|i| seed.wrapping_add(i as u8))
            .collect::<Vec<u8>>(),
    )
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let cli = Cli::parse();
    if let Some(side) = cli.raw_pingpong {
        std::process::exit(raw_pingpong(&cli, side));
    }
    let runtime = if cli.single_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build();
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => {
            eprintln!("link-worker: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("link-worker: {e}");
            std::process::exit(1);
        }
    }
}

async fn run(cli: Cli) -> Result<i32, String> {
    let started = Instant::now();
    let me = task(&cli.job, cli.task_id);
    let options = cli.tls.client_options(cli.coordinators.clone())?;
    let tls = options.tls.clone();
    let coord = CoordClient::new(options).map_err(|e| e.message().to_string())?;
    let agent = if cli.agent {
        let mut config = AgentConfig::new(cli.coordinators.clone(), &cli.job, cli.task_id as i32);
        config.tls = tls;
        let agent = Agent::new(config, |_| {}).map_err(|e| e.message().to_string())?;
        agent.connect().await.map_err(|e| e.message().to_string())?;
        Some(agent)
    } else {
        None
    };

    let mgr = RendezvousMgr::new();
    let listener = tokio::net::TcpListener::bind(&cli.listen)
        .await
        .map_err(|e| format!("bind {}: {e}", cli.listen))?;
    let address = listener
        .local_addr()
        .map_err(|e| e.to_string())?
        .to_string();
    let service = LinkService::new(mgr.clone(), &me, rand::random::<u64>() | 1);
    tokio::spawn(async move {
        if let Err(e) = service.serve(listener).await {
            eprintln!("link-worker: serving the link: {e}");
        }
    });
    link::publish(&coord, &me, &address)
        .await
        .map_err(|e| format!("publishing the link address: {}", e.message()))?;
    println!("LINK {address}");

    let links = Links::with_kv(coord.clone());
    let on_event: OnPeer = {
        let agent = agent.clone();
        Arc::new(move |event: &PeerEvent| {
            let (peer, error) = match event {
                PeerEvent::Up { task, .. } => {
                    println!("PEER_UP {task}");
                    return;
                }
                PeerEvent::Dead { task, error } => (task, error),
            };
            println!(
                "PEER_DEAD {peer} {} {}",
                started.elapsed().as_millis(),
                error.message
            );
            // Once in ERROR (an earlier dead peer), the agent refuses further reports.
            if let Some(agent) = agent.clone().filter(|a| a.state() != AgentState::Error) {
                let status = tonic::Status::unavailable(error.message.clone());
                tokio::spawn(async move {
                    if let Err(e) = agent.report_error(&status).await {
                        eprintln!("link-worker: reporting the dead peer: {}", e.message());
                    }
                });
            }
        })
    };
    let watched = match &cli.watch {
        Some(ids) => ids.iter().map(|id| task(&cli.job, *id)).collect(),
        None => job_tasks(&coord, &cli.job)
            .await
            .map_err(|e| format!("listing the tasks of job {}: {}", cli.job, e.message()))?,
    };
    println!("WATCHING {}", watched.len());
    let _monitor = PeerMonitor::start(
        links.clone(),
        me.clone(),
        watched,
        PeerOptions {
            interval: Duration::from_millis(cli.heartbeat_ms),
            timeout: Duration::from_millis(cli.peer_timeout_ms),
        },
        on_event,
    );
    let session = WorkerSession {
        task: me.clone(),
        links,
    };
    let code = match cli.role {
        Role::Produce => produce(&cli, &mgr, &session).await?,
        Role::Consume => consume(&cli, &mgr, &session, started).await?,
        Role::Idle => {
            let _ = tokio::signal::ctrl_c().await;
            0
        }
    };
    Ok(code)
}

/// Sends every step's tensors, keeping at most `window` steps not yet taken by the consumer, and
/// cleans up each step once its tensors are gone. Then serves until killed.
async fn produce(cli: &Cli, mgr: &RendezvousMgr, session: &WorkerSession) -> Result<i32, String> {
    // One buffer per tensor index, reused by every step when the tensors are large (the consumer
    // checks them against the same pattern): the producer's memory stays one step's worth.
    let reuse = cli.bytes >= 1 << 20;
    let shared: Vec<Bytes> = (0..cli.tensors).map(|t| payload(0, t, cli.bytes)).collect();
    let mut outstanding = std::collections::VecDeque::new();
    for step in 0..cli.steps {
        let r = mgr.find(step);
        r.initialize(session.clone()).map_err(|e| e.message)?;
        for t in 0..cli.tensors {
            let data = if reuse {
                shared[t as usize].clone()
            } else {
                payload(step, t, cli.bytes)
            };
            let tensor = Tensor::new(DType::UInt8, vec![cli.bytes as i64], data)?;
            r.send(&key(cli, cli.task_id, cli.partner, step, t)?, tensor, false)
                .map_err(|e| e.message)?;
        }
        outstanding.push_back(r);
        while outstanding.len() as i64 >= cli.window
            || (step + 1 == cli.steps && !outstanding.is_empty())
        {
            while outstanding.front().is_some_and(|r| r.pending() == 0) {
                if let Some(r) = outstanding.pop_front() {
                    mgr.cleanup(r.step_id());
                }
            }
            if (outstanding.len() as i64) < cli.window && step + 1 < cli.steps {
                break;
            }
            if outstanding.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    println!(
        "DONE {{\"steps\":{},\"live_steps\":{},\"rss_bytes\":{}}}",
        cli.steps,
        mgr.live_steps(),
        rss_bytes()
    );
    let _ = tokio::signal::ctrl_c().await;
    Ok(0)
}

/// Receives and checks every step's tensors, with `--inflight` receives outstanding, measuring
/// each receive (a round trip when one is outstanding).
async fn consume(
    cli: &Cli,
    mgr: &RendezvousMgr,
    session: &WorkerSession,
    started: Instant,
) -> Result<i32, String> {
    let reuse = cli.bytes >= 1 << 20;
    // Large tensors repeat one pattern per tensor index: made once, not inside the timed loop.
    let expected: Vec<Bytes> = if reuse {
        (0..cli.tensors).map(|t| payload(0, t, cli.bytes)).collect()
    } else {
        Vec::new()
    };
    let tensors = i64::from(cli.tensors);
    let total_n = cli.steps * tensors;
    let receive = |i: i64| -> Result<_, String> {
        let (step, t) = (i / tensors, (i % tensors) as u32);
        let r = mgr.find(step);
        if t == 0 {
            r.initialize(session.clone()).map_err(|e| e.message)?;
        }
        let k = key(cli, cli.partner, cli.task_id, step, t)?;
        Ok(async move {
            let asked = Instant::now();
            let got = r.recv(&k).await;
            (step, t, k, asked.elapsed(), got)
        })
    };
    let mut latencies = Vec::with_capacity(total_n as usize);
    let mut rss_at_10pct = 0;
    let transfer_started = Instant::now();
    let mut outstanding = futures::stream::FuturesOrdered::new();
    let mut next = 0;
    while next < total_n.min(cli.inflight.max(1)) {
        outstanding.push_back(receive(next)?);
        next += 1;
    }
    while let Some((step, t, k, took, got)) = futures::StreamExt::next(&mut outstanding).await {
        let got = match got {
            Ok(g) => g,
            Err(e) => {
                println!("RECV_ERROR {} {}", started.elapsed().as_millis(), e.message);
                return Ok(3);
            }
        };
        latencies.push(took);
        if next < total_n {
            outstanding.push_back(receive(next)?);
            next += 1;
        }
        let want = match expected.get(t as usize) {
            Some(w) => w.clone(),
            None => payload(step, t, cli.bytes),
        };
        if got.tensor.data() != &want {
            println!(
                "RECV_ERROR {} tensor {k} has the wrong bytes",
                started.elapsed().as_millis()
            );
            return Ok(3);
        }
        if i64::from(t) + 1 < tensors {
            continue;
        }
        mgr.cleanup(step);
        if step == cli.steps / 10 {
            rss_at_10pct = rss_bytes();
        }
        if step % 100 == 99 || cli.bytes >= 1 << 20 {
            println!("STEP {}", step + 1);
        }
    }
    let secs = transfer_started.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |p: f64| percentile_us(&latencies, p);
    let total = cli.steps as f64 * cli.tensors as f64 * cli.bytes as f64;
    println!(
        "DONE {{\"steps\":{},\"tensors\":{},\"seconds\":{secs:.6},\"bytes_per_second\":{:.0},\"p50_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1},\"live_steps\":{},\"rss_bytes_at_10pct\":{rss_at_10pct},\"rss_bytes\":{}}}",
        cli.steps,
        latencies.len(),
        total / secs,
        pct(0.5),
        pct(0.99),
        pct(1.0),
        mgr.live_steps(),
        rss_bytes()
    );
    Ok(0)
}

/// `--raw-pingpong`: plain blocking sockets, so that the anchor measures the kernel's loopback and
/// two processes waking each other, and nothing of this crate's.
fn raw_pingpong(cli: &Cli, side: PingPong) -> i32 {
    let result = match side {
        PingPong::Serve => pingpong_serve(cli),
        PingPong::Client => pingpong_client(cli),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            println!("RECV_ERROR {e}");
            3
        }
    }
}

/// Echoes `--bytes`-byte messages on the first connection until the client closes it.
fn pingpong_serve(cli: &Cli) -> Result<(), String> {
    use std::io::{ErrorKind, Read, Write};
    let listener = std::net::TcpListener::bind(&cli.listen)
        .map_err(|e| format!("bind {}: {e}", cli.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    println!("LINK {address}");
    let (mut socket, _) = listener.accept().map_err(|e| format!("accept: {e}"))?;
    socket.set_nodelay(true).map_err(|e| e.to_string())?;
    let mut message = vec![0u8; cli.bytes];
    loop {
        match socket.read_exact(&mut message) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(format!("read: {e}")),
        }
        socket
            .write_all(&message)
            .map_err(|e| format!("write: {e}"))?;
    }
}

/// Times `--steps` round trips after `--warmup`, checking that every echo is the message sent.
fn pingpong_client(cli: &Cli) -> Result<(), String> {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(&cli.connect)
        .map_err(|e| format!("connect {}: {e}", cli.connect))?;
    socket.set_nodelay(true).map_err(|e| e.to_string())?;
    let sent = payload(1, 0, cli.bytes);
    let mut echo = vec![0u8; cli.bytes];
    let mut latencies = Vec::with_capacity(cli.steps.max(0) as usize);
    let started = Instant::now();
    for i in 0..cli.warmup.max(0) + cli.steps.max(0) {
        let asked = Instant::now();
        socket.write_all(&sent).map_err(|e| format!("write: {e}"))?;
        socket
            .read_exact(&mut echo)
            .map_err(|e| format!("read: {e}"))?;
        let took = asked.elapsed();
        if echo != sent {
            return Err(format!("round trip {i} came back with other bytes"));
        }
        if i >= cli.warmup {
            latencies.push(took);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort();
    println!(
        "DONE {{\"steps\":{},\"seconds\":{secs:.6},\"p50_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1}}}",
        latencies.len(),
        percentile_us(&latencies, 0.5),
        percentile_us(&latencies, 0.99),
        percentile_us(&latencies, 1.0),
    );
    Ok(())
}

/// The `p` quantile of sorted `latencies`, in microseconds (0 when there are none).
fn percentile_us(latencies: &[Duration], p: f64) -> f64 {
    latencies
        .get(((latencies.len() as f64 - 1.0) * p).round() as usize)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

//! `coord-bench rendezvous`: tensors worker → worker over the links, beside iperf3 on loopback.
//!
//! A 3-replica ensemble only publishes the two workers' link addresses; the tensors go directly
//! from a producer `link-worker` to a consumer `link-worker`, which checks every byte. Measured:
//! - 4 KiB tensors: the consumer's receive latency with the tensor already produced (one request
//!   and its reply on the link: the round trip), p50 and p99, against a raw TCP ping-pong of
//!   4 KiB messages between two `link-worker --raw-pingpong` processes (blocking sockets,
//!   `TCP_NODELAY`) in the same run: what two processes on this loopback can do at all;
//! - 64 MiB tensors: throughput with two receives outstanding (as an executor has several
//!   receives of a step pending), the consumer's byte-for-byte check included, against iperf3's
//!   single TCP stream on loopback in the same run;
//! - peer death: from `kill -9` (and from SIGSTOP, a hung peer) to the watcher's `PEER_DEAD`,
//!   with a 1 s heartbeat interval.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{free_ports, send_signal, Cluster, ClusterOptions};
use crate::link::{LinkWorker, WATCH_PAIR};

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Steps of one 4 KiB tensor (latency).
    #[arg(long, default_value_t = 20_000)]
    pub small_steps: i64,
    /// Steps of one 64 MiB tensor (throughput).
    #[arg(long, default_value_t = 48)]
    pub large_steps: i64,
    /// Round trips of the raw TCP ping-pong anchor (after 1,000 untimed ones).
    #[arg(long, default_value_t = 20_000)]
    pub pingpong_steps: i64,
    /// Skip iperf3 (no ratio then).
    #[arg(long)]
    pub no_iperf: bool,
    /// Run each worker on tokio's multi-threaded runtime (default: one thread each, which halves
    /// the small-tensor round trip here and moves large tensors as fast).
    #[arg(long)]
    pub multi_thread: bool,
}

const TIMEOUT: Duration = Duration::from_secs(600);

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn transfer(
    c: &Cluster,
    steps: i64,
    bytes: usize,
    inflight: u32,
    single_thread: bool,
) -> Result<serde_json::Value, String> {
    let mut shared = vec![
        "--steps".to_string(),
        steps.to_string(),
        "--bytes".to_string(),
        bytes.to_string(),
        "--inflight".to_string(),
        inflight.to_string(),
    ];
    if single_thread {
        shared.push("--single-thread".into());
    }
    let with = |role: &str, partner: &str| -> Vec<String> {
        let mut v = vec![
            "--role".into(),
            role.into(),
            "--partner".into(),
            partner.into(),
        ];
        v.extend(shared.iter().cloned());
        v
    };
    let (mut p, q) = (with("produce", "2"), with("consume", "1"));
    // The producer sleeps (1 ms, the timer's grain) when it is this many steps ahead: at least
    // 4 MiB of small tensors, so that the consumer never waits for a send and its receives time
    // the link alone.
    p.extend([
        "--window".into(),
        (4usize << 20).div_ceil(bytes).max(16).to_string(),
    ]);
    let _producer = LinkWorker::start(&c.endpoints(), 1, &strs(&p));
    let consumer = LinkWorker::start(&c.endpoints(), 2, &strs(&q));
    // A failed receive ends the consumer at once: report it rather than wait out the timeout.
    match consumer.wait_any(&["DONE ", "RECV_ERROR"], TIMEOUT) {
        Some((_, l)) if l.starts_with("RECV_ERROR") => Err(l),
        Some(_) => Ok(consumer.done(Duration::ZERO)),
        None => Err(format!("the consumer did not finish within {TIMEOUT:?}")),
    }
}

/// The raw TCP ping-pong of 4 KiB messages between two processes: the `DONE` JSON of its client.
fn raw_pingpong(c: &Cluster, steps: i64) -> Result<serde_json::Value, String> {
    let server = LinkWorker::start(
        &c.endpoints(),
        1,
        &["--raw-pingpong", "serve", "--bytes", "4096"],
    );
    let (_, line) = server
        .wait_any(&["LINK ", "RECV_ERROR"], TIMEOUT)
        .ok_or("the ping-pong server did not start")?;
    let address = line
        .strip_prefix("LINK ")
        .ok_or_else(|| format!("the ping-pong server failed: {line}"))?;
    let steps = steps.to_string();
    let client = LinkWorker::start(
        &c.endpoints(),
        2,
        &[
            "--raw-pingpong",
            "client",
            "--connect",
            address,
            "--steps",
            &steps,
            "--bytes",
            "4096",
        ],
    );
    match client.wait_any(&["DONE ", "RECV_ERROR"], TIMEOUT) {
        Some((_, l)) if l.starts_with("RECV_ERROR") => Err(format!("raw ping-pong: {l}")),
        Some(_) => Ok(client.done(Duration::ZERO)),
        None => Err(format!("the ping-pong did not finish within {TIMEOUT:?}")),
    }
}

/// Milliseconds from silencing a watched peer (by `signal`) to the watcher declaring it dead.
fn peer_death(c: &Cluster, signal: &str) -> Result<f64, String> {
    let watcher = LinkWorker::start(&c.endpoints(), 1, &WATCH_PAIR);
    let mut peer = LinkWorker::start(&c.endpoints(), 2, &WATCH_PAIR);
    for w in [&watcher, &peer] {
        w.wait_line("LINK", TIMEOUT)
            .ok_or("a link-worker did not start")?;
    }
    watcher
        .wait_line("PEER_UP", TIMEOUT)
        .ok_or("the watcher never heard from its peer")?;
    let at = if signal == "KILL" {
        peer.kill()
    } else {
        let at = Instant::now();
        send_signal(i64::from(peer.pid()), signal);
        at
    };
    let (seen, _) = watcher
        .wait_line("PEER_DEAD", Duration::from_secs(30))
        .ok_or("the watcher never declared its peer dead")?;
    send_signal(i64::from(peer.pid()), "CONT");
    Ok(seen.duration_since(at).as_secs_f64() * 1e3)
}

/// iperf3 on this machine, installed from Debian's archive if missing.
fn ensure_iperf3() -> Result<(), String> {
    let present = || {
        Command::new("iperf3")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if present() {
        return Ok(());
    }
    eprintln!("iperf3 not found; installing Debian's iperf3 (apt-get install -y iperf3)");
    let _ = Command::new("apt-get")
        .args(["install", "-y", "iperf3"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status();
    if present() {
        Ok(())
    } else {
        Err("iperf3 is not installed: apt-get install iperf3 (or pass --no-iperf)".into())
    }
}

/// iperf3's single-stream loopback throughput, bytes per second (received side, 5 s).
fn iperf3() -> Result<f64, String> {
    ensure_iperf3()?;
    let port = free_ports(1)[0].to_string();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-p", &port])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3 -s: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port, "-t", "5", "-J"])
            .output()
            .map_err(|e| format!("iperf3 -c: {e}"))?;
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = server.kill();
    let _ = server.wait();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("iperf3 -J output: {e}"))?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 8.0)
        .ok_or_else(|| {
            format!(
                "iperf3 gave no throughput: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
}

pub async fn run(args: Args) -> Result<(), String> {
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(TIMEOUT).await;
    let c = &cluster;
    eprintln!("4 KiB tensors, {} steps", args.small_steps);
    let small =
        tokio::task::block_in_place(|| transfer(c, args.small_steps, 4096, 1, !args.multi_thread))?;
    eprintln!(
        "raw TCP ping-pong, 4 KiB, {} round trips",
        args.pingpong_steps
    );
    let pingpong = tokio::task::block_in_place(|| raw_pingpong(c, args.pingpong_steps))?;
    eprintln!("64 MiB tensors, {} steps", args.large_steps);
    let large = tokio::task::block_in_place(|| {
        transfer(c, args.large_steps, 64 << 20, 2, !args.multi_thread)
    })?;
    eprintln!("peer death (kill -9, then SIGSTOP)");
    let killed = tokio::task::block_in_place(|| peer_death(c, "KILL"))?;
    let stopped = tokio::task::block_in_place(|| peer_death(c, "STOP"))?;
    let iperf = if args.no_iperf {
        None
    } else {
        eprintln!("iperf3, one stream on loopback, 5 s");
        Some(tokio::task::block_in_place(iperf3)?)
    };
    print_table(&Results {
        small,
        pingpong,
        large,
        iperf,
        killed,
        stopped,
    });
    Ok(())
}

/// What one run measured.
struct Results {
    small: serde_json::Value,
    pingpong: serde_json::Value,
    large: serde_json::Value,
    /// iperf3's bytes per second, unless skipped.
    iperf: Option<f64>,
    killed: f64,
    stopped: f64,
}

/// The table: each measurement beside its anchor on this loopback in the same run, and the target
/// for the ratio.
fn print_table(r: &Results) {
    let gbs = |b: f64| b / 1e9;
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    println!("\n| rendezvous, worker → worker on loopback | coord | anchor, same run | coord vs anchor | target |");
    println!("|---|---:|---:|---:|---:|");
    let large_bps = f(&r.large, "bytes_per_second");
    println!(
        "| 64 MiB tensors, throughput | {:.2} GB/s | iperf3, 1 TCP stream: {} | {} of iperf3 | ≥ 60 % |",
        gbs(large_bps),
        r.iperf.map_or("-".into(), |i| format!("{:.2} GB/s", gbs(i))),
        r.iperf.map_or("-".into(), |i| format!("{:.0} %", 100.0 * large_bps / i)),
    );
    let (p50, raw_p50) = (f(&r.small, "p50_us"), f(&r.pingpong, "p50_us"));
    println!(
        "| 4 KiB tensors, receive round trip p50 / p99 | {p50:.0} µs / {:.0} µs | raw TCP ping-pong, 4 KiB: {raw_p50:.0} µs / {:.0} µs | {:.2}× (p50) | p50 ≤ 2× |",
        f(&r.small, "p99_us"),
        f(&r.pingpong, "p99_us"),
        p50 / raw_p50,
    );
    println!(
        "| 4 KiB tensors, rate | {:.0}/s | | | |",
        f(&r.small, "tensors") / f(&r.small, "seconds")
    );
    println!(
        "| peer death detected, 1 s heartbeats: kill -9 | {:.0} ms | | | ≤ 2,000 ms |",
        r.killed
    );
    println!(
        "| peer death detected, 1 s heartbeats: SIGSTOP (hung) | {:.0} ms | | | ≤ 2,000 ms |",
        r.stopped
    );
}

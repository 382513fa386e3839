//! The store traffic of `init_process_group` for N ranks at once, simulated on one tokio runtime
//! with torch's wire ([`crate::tcpstore_client`]): every rank connects (VALIDATE and PING),
//! rank 0 sets the master address, every rank ADDs itself to the join counter, the last to join
//! sets the all-joined key, every rank WAITs for it and then GETs the master address (WAIT + GET,
//! as torch's client does). The time from the first connect to the last rank done.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use crate::tcpstore_client::StoreClient;

/// How long a connect may keep being refused or dropped before the run fails (torch's own
/// client retries for its whole timeout, 300 s by default).
const CONNECT_FOR: Duration = Duration::from_secs(60);

/// Ranks connecting from one loopback address: under the 28,232 ephemeral ports Linux gives one
/// source address toward one server address by default (`ip_local_port_range`).
const RANKS_PER_SOURCE: usize = 20_000;

/// The loopback address rank `rank` connects from: 127.0.0.1 for the first
/// [`RANKS_PER_SOURCE`], 127.0.0.2 for the next, and so on.
fn source(rank: usize) -> IpAddr {
    let first = u32::from(Ipv4Addr::LOCALHOST);
    IpAddr::V4(Ipv4Addr::from(first + (rank / RANKS_PER_SOURCE) as u32))
}

/// Takes the host's hard limit of open files: every simulated rank holds a connection of its own
/// until all are done (100,000 ranks, 100,000 descriptors). Where it cannot, says so and carries
/// on (a run past the limit then fails with "Too many open files").
pub fn raise_open_files_limit() {
    match coord_agent::open_files::raise_to_hard_limit() {
        Ok(Some((from, to))) => {
            eprintln!("coord-bench: open files limit raised from {from} to {to}")
        }
        Ok(None) => {}
        Err(e) => eprintln!("coord-bench: cannot raise the open files limit: {e}"),
    }
}

async fn connect(addr: &str, rank: usize) -> Result<StoreClient, String> {
    let deadline = Instant::now() + CONNECT_FOR;
    let mut backoff = Duration::from_millis(10);
    loop {
        match StoreClient::connect_from(addr, source(rank)).await {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() > deadline => return Err(format!("connect {addr}: {e}")),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// When one rank finished each step, counted from the start of the round.
#[derive(Clone, Copy, Default)]
struct Steps {
    connected: Duration,
    added: Duration,
    released: Duration,
    done: Duration,
}

async fn rank(
    addr: String,
    rank: usize,
    world: usize,
    tag: String,
    start: Instant,
) -> Result<(StoreClient, Steps), String> {
    let mut c = connect(&addr, rank).await?;
    let mut steps = Steps {
        connected: start.elapsed(),
        ..Steps::default()
    };
    let io = |e: std::io::Error| format!("rank {rank} on {addr}: {e}");
    let master = format!("/{tag}/MASTER_ADDR").into_bytes();
    let joined = format!("/{tag}/all_joined").into_bytes();
    if rank == 0 {
        c.set(&master, b"10.0.0.1:29500").await.map_err(io)?;
    }
    let n = c
        .add(format!("/{tag}/init").as_bytes(), 1)
        .await
        .map_err(io)?;
    steps.added = start.elapsed();
    if n == world as i64 {
        c.set(&joined, b"1").await.map_err(io)?;
    }
    c.wait(&[&joined]).await.map_err(io)?;
    steps.released = start.elapsed();
    let m = c.get(&master).await.map_err(io)?;
    if m != b"10.0.0.1:29500" {
        return Err(format!("rank {rank} read the master address {m:?}"));
    }
    steps.done = start.elapsed();
    Ok((c, steps))
}

/// Runs `world` simulated ranks against the store at `addr` (keys under `/{tag}`); the time until
/// every one of them is done, or why not (a deadline of `timeout` in all). Prints when the last
/// rank had connected (VALIDATE and PING answered), ADDed, been released from its WAIT and read
/// the master address: where the time goes.
pub async fn init_ranks(
    addr: &str,
    world: usize,
    tag: &str,
    timeout: Duration,
) -> Result<Duration, String> {
    let start = Instant::now();
    let mut ranks = tokio::task::JoinSet::new();
    for r in 0..world {
        ranks.spawn(rank(addr.to_string(), r, world, tag.to_string(), start));
    }
    // The connections stay open until every rank is done, as in a job.
    let mut done = Vec::with_capacity(world);
    let mut last = Steps::default();
    let all = async {
        while let Some(r) = ranks.join_next().await {
            let (c, s) = r.map_err(|e| e.to_string())??;
            last.connected = last.connected.max(s.connected);
            last.added = last.added.max(s.added);
            last.released = last.released.max(s.released);
            last.done = last.done.max(s.done);
            done.push(c);
        }
        Ok::<(), String>(())
    };
    tokio::time::timeout(timeout, all)
        .await
        .map_err(|_| format!("{world} ranks on {addr}: not all done within {timeout:?}"))??;
    let took = start.elapsed();
    drop(done);
    let s = |d: Duration| format!("{:.3}", d.as_secs_f64());
    eprintln!(
        "    the last rank connected at {} s, had ADDed at {}, was released at {}, done at {}",
        s(last.connected),
        s(last.added),
        s(last.released),
        s(last.done)
    );
    Ok(took)
}

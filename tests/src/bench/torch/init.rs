//! The store traffic of `init_process_group` for N ranks at once, simulated with torch's wire
//! ([`crate::tcpstore_client`]): every rank connects (VALIDATE and PING), rank 0 sets the master
//! address, every rank ADDs itself to the join counter, the last to join sets the all-joined key,
//! every rank WAITs for it and then GETs the master address (WAIT + GET, as torch's client does).
//! The time from the first connect to the last rank done.
//!
//! A round's ranks are clients of one store (torch's own) or of several coord-proxies, rank `r`
//! of the sidecar of its host as in a job ([`Round::store_of`]). Every rank holds a descriptor
//! until the round ends: [`super::ranks`] runs a round here, or spread over child processes where
//! one may not open that many ([`ranks_per_process`]).

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::time::{Duration, Instant};

use crate::tcpstore_client::StoreClient;

/// How long a connect may keep being refused or dropped before the run fails: torch's own client
/// retries for its whole timeout, 300 s by default. (A SYN a full accept queue dropped is sent
/// again 1, 3, 7, … 63 s later: in a burst of 100,000 ranks one connect took longer than 60 s.)
const CONNECT_FOR: Duration = Duration::from_secs(300);

/// Ranks connecting from one loopback address: under the 28,232 ephemeral ports Linux gives one
/// source address toward one server address by default (`ip_local_port_range`).
const RANKS_PER_SOURCE: usize = 20_000;

/// Descriptors a process keeps for itself beside its ranks' connections (its runtime, stdio, the
/// pipes to its parent, a store's listener and its links to the ensemble).
const DESCRIPTORS_KEPT: u64 = 256;

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

/// The connections one process of this host may hold: its open files limit (after
/// [`raise_open_files_limit`], the hard one, which its children and the stores it starts
/// inherit) less what it keeps for itself. The same bound holds for a store serving them.
pub fn ranks_per_process() -> usize {
    let limit = coord_agent::open_files::limit().unwrap_or(1024);
    limit.saturating_sub(DESCRIPTORS_KEPT).max(1) as usize
}

/// One round of `world` ranks: the stores they are clients of and the tag their keys go under.
#[derive(Clone, Debug)]
pub struct Round {
    /// Store addresses; the ranks are spread over them in blocks, as a job's ranks over the
    /// sidecars of their hosts.
    pub stores: Vec<String>,
    pub world: usize,
    /// Keys go under `/{tag}`.
    pub tag: String,
}

impl Round {
    /// The store rank `rank` is a client of: `stores[rank * stores / world]`.
    pub fn store_of(&self, rank: usize) -> &str {
        let i = rank * self.stores.len() / self.world.max(1);
        &self.stores[i.min(self.stores.len() - 1)]
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

/// When the last rank finished each step, counted from the start of the round.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Steps {
    pub connected: Duration,
    pub added: Duration,
    pub released: Duration,
    pub done: Duration,
}

impl Steps {
    /// The later of each step.
    pub fn latest(self, other: Steps) -> Steps {
        Steps {
            connected: self.connected.max(other.connected),
            added: self.added.max(other.added),
            released: self.released.max(other.released),
            done: self.done.max(other.done),
        }
    }
}

async fn rank(
    round: std::sync::Arc<Round>,
    rank: usize,
    start: Instant,
) -> Result<(StoreClient, Steps), String> {
    let (addr, world, tag) = (round.store_of(rank), round.world, &round.tag);
    let mut c = connect(addr, rank).await?;
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

/// Runs ranks `ranks` of `round` on this runtime, from `start`: when the last of them finished
/// each step, and their connections, which the caller holds until the whole round is done (as in
/// a job, where no rank leaves before the others are in).
pub async fn run_ranks(
    round: &Round,
    ranks: Range<usize>,
    start: Instant,
) -> Result<(Steps, Vec<StoreClient>), String> {
    let round = std::sync::Arc::new(round.clone());
    let mut set = tokio::task::JoinSet::new();
    for r in ranks.clone() {
        set.spawn(rank(round.clone(), r, start));
    }
    let mut held = Vec::with_capacity(ranks.len());
    let mut last = Steps::default();
    while let Some(r) = set.join_next().await {
        let (c, s) = r.map_err(|e| e.to_string())??;
        last = last.latest(s);
        held.push(c);
    }
    Ok((last, held))
}

#[cfg(test)]
mod tests {
    use super::Round;

    #[test]
    fn a_hosts_ranks_are_clients_of_its_sidecar() {
        let round = Round {
            stores: vec!["a".into(), "b".into(), "c".into()],
            world: 10,
            tag: "t".into(),
        };
        let of: Vec<&str> = (0..10).map(|r| round.store_of(r)).collect();
        assert_eq!(of, ["a", "a", "a", "a", "b", "b", "b", "c", "c", "c"]);
        let one = Round {
            stores: vec!["s".into()],
            ..round
        };
        assert!((0..10).all(|r| one.store_of(r) == "s"));
    }
}

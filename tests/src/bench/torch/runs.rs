//! The benchmark's torch processes, from the venv: torch's own store, torchrun's time from its
//! start to the first training step, and a torch client calling the store across leader kills.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::bench::coord_target::CoordEnsemble;
use crate::bench::Ensemble;
use crate::cluster::{free_ports, Cluster};
use crate::torch::Torch;
use crate::torchrun::{Launched, NodeArgs};

/// torch's own TCPStore server (libuv), standing alone; killed when dropped.
pub struct OwnStore {
    pub addr: String,
    /// How its name lookups were served (for the report).
    pub lookups: &'static str,
    _proc: Launched,
    _resolver: Option<tempfile::TempDir>,
}

/// What a name lookup costs torch's own store decides its time for many ranks: its libuv server
/// looks up the name of every peer it accepts (`getnameinfo`, a reverse DNS query), blocking its
/// only event-loop thread. This machine's resolver leaves some of those queries unanswered, and
/// each then stalls the whole store for glibc's 5 s resolver timeout (strace of the store:
/// `poll([{fd=…}], 1, 5000) = 0 (Timeout)` on the DNS socket; 256 ranks met five of them, 25 s).
/// A cluster's DNS answers, so the fair anchor is the store with lookups that end at once: it runs
/// in a mount namespace of its own (`unshare -m`) whose `/etc/resolv.conf` names a resolver on
/// 127.0.0.1, where nothing listens, so every lookup is refused at once and the address is used.
const INSTANT_LOOKUPS: &str =
    "lookups refused at once (own mount namespace, resolver on 127.0.0.1)";
const SYSTEM_LOOKUPS: &str = "this machine's resolver (each unanswered lookup stalls it 5 s)";

impl OwnStore {
    /// torch's own store with name lookups that end at once, or, where a mount namespace cannot
    /// be made here (not root, no `unshare`), with this machine's resolver, saying so.
    pub fn start(torch: &Torch) -> Result<OwnStore, String> {
        match Self::start_with(torch, true) {
            Ok(s) => Ok(s),
            Err(why) => {
                eprintln!(
                    "  torch's own store cannot run with instant name lookups ({why}); it runs with {SYSTEM_LOOKUPS}"
                );
                Self::start_with(torch, false)
            }
        }
    }

    fn start_with(torch: &Torch, instant_lookups: bool) -> Result<OwnStore, String> {
        let port = free_ports(1)[0];
        let script = Torch::script("own_store.py");
        let python = torch.bin().join("python");
        let mut resolver = None;
        let cmd = if instant_lookups {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let conf = dir.path().join("resolv.conf");
            std::fs::write(&conf, "nameserver 127.0.0.1\n").map_err(|e| e.to_string())?;
            let mut unshare = Command::new("unshare");
            unshare
                .args(["-m", "--propagation", "private", "sh", "-c"])
                .arg(r#"mount --bind "$0" /etc/resolv.conf && exec "$@""#)
                .arg(&conf)
                .arg(&python)
                .arg(&script)
                .arg(port.to_string());
            resolver = Some(dir);
            torch.command_under(unshare)
        } else {
            let mut cmd = torch.command("python");
            cmd.arg(&script).arg(port.to_string());
            cmd
        };
        let mut proc = Launched::spawn(cmd);
        proc.try_wait_for("ready", Duration::from_secs(120))?;
        Ok(OwnStore {
            addr: format!("127.0.0.1:{port}"),
            lookups: if instant_lookups {
                INSTANT_LOOKUPS
            } else {
                SYSTEM_LOOKUPS
            },
            _proc: proc,
            _resolver: resolver,
        })
    }
}

/// torchrun, 1 node × 2 workers, its c10d rendezvous on the store at `endpoint` (which it does
/// not host): the time from its start to rank 0's first training step. It then runs to its end
/// (3 steps), which must be exit 0.
pub fn first_step(torch: &Torch, endpoint: &str, run_id: &str) -> Result<Duration, String> {
    let args = NodeArgs {
        nnodes: "1",
        nproc_per_node: 2,
        endpoint,
        run_id,
        conf: "is_host=false",
        extra: &[],
        steps: 3,
    }
    .to_args();
    let start = Instant::now();
    let mut run = Launched::start(torch, &args);
    run.try_wait_for("step 0 ", Duration::from_secs(120))?;
    let took = start.elapsed();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match run.exited() {
            Some(Some(0)) => return Ok(took),
            Some(code) => {
                return Err(format!(
                    "torchrun on {endpoint} exited {code:?}:\n{}",
                    run.seen.join("\n")
                ))
            }
            None if Instant::now() > deadline => {
                return Err(format!("torchrun on {endpoint} did not end within 120 s"))
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A torch client (`tests/torch/store_stall.py`: ADD back to back on one connection) on
/// coord-proxy at `store` while the leader is killed (`kill -9`) `kills` times, each time left
/// down until the others elected a leader, then restarted and caught up before the next: per
/// kill, the longest call the client saw.
pub async fn stalls(
    torch: &Torch,
    cluster: &mut Cluster,
    store: &str,
    kills: usize,
) -> Result<Vec<Duration>, String> {
    let (host, port) = store
        .rsplit_once(':')
        .ok_or("a store address is HOST:PORT")?;
    let mut cmd = torch.command("python");
    cmd.arg(Torch::script("store_stall.py")).args([host, port]);
    let mut client = Launched::spawn(cmd);
    client.try_wait_for("ready", Duration::from_secs(120))?;
    let mut ensemble = CoordEnsemble::new(cluster);
    let mut worst = Vec::with_capacity(kills);
    for k in 0..kills {
        // Calls flowing before the kill.
        tokio::time::sleep(Duration::from_secs(1)).await;
        client.drain();
        let before = client.seen.len();
        let term = |c: &Cluster| {
            c.ids()
                .iter()
                .filter_map(|&i| c.status(i))
                .map(|s| s.term)
                .max()
        };
        let term_before = term(ensemble.cluster);
        let killed = ensemble.kill_leader().await;
        // The killed replica stays down until the others have elected a leader: restarted at
        // once, it would come back inside its followers' election timeout and lead on in the
        // same term (openraft resumes a committed vote of its own), and no failover would happen.
        let leader = ensemble
            .cluster
            .wait_for_leader(Duration::from_secs(30))
            .await;
        let term_after = term(ensemble.cluster);
        tokio::time::sleep(Duration::from_millis(500)).await;
        ensemble.recover().await;
        if let Some(code) = client.exited() {
            return Err(format!(
                "the torch client ended ({code:?}) after kill {k}:\n{}",
                client.seen.join("\n")
            ));
        }
        let gap = client.seen[before..]
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["gap"].as_f64())
            .fold(0.0, f64::max);
        eprintln!(
            "  kill {k} ({killed}, term {term_before:?}; now replica {leader} leads, term {term_after:?}): the torch client's longest call {gap:.3} s"
        );
        worst.push(Duration::from_secs_f64(gap));
    }
    Ok(worst)
}

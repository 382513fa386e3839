//! The benchmark's torch processes, from the venv: torch's own store, torchrun's time from its
//! start to the first training step, and a torch client calling the store across leader kills.

use std::time::{Duration, Instant};

use crate::bench::coord_target::CoordEnsemble;
use crate::bench::Ensemble;
use crate::cluster::{free_ports, Cluster};
use crate::torch::Torch;
use crate::torchrun::{Launched, NodeArgs};

/// torch's own TCPStore server (libuv), standing alone; killed when dropped.
pub struct OwnStore {
    pub addr: String,
    _proc: Launched,
}

impl OwnStore {
    pub fn start(torch: &Torch) -> Result<OwnStore, String> {
        let port = free_ports(1)[0];
        let mut cmd = torch.command("python");
        cmd.arg(Torch::script("own_store.py")).arg(port.to_string());
        let mut proc = Launched::spawn(cmd);
        proc.try_wait_for("ready", Duration::from_secs(120))?;
        Ok(OwnStore {
            addr: format!("127.0.0.1:{port}"),
            _proc: proc,
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
/// coord-proxy at `store` while the leader is killed (`kill -9`) `kills` times, each time
/// restarted and caught up before the next: per kill, the longest call the client saw.
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
        let killed = ensemble.kill_leader().await;
        ensemble.recover().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
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
        eprintln!("  kill {k} ({killed}): the torch client's longest call {gap:.3} s");
        worst.push(Duration::from_secs_f64(gap));
    }
    Ok(worst)
}

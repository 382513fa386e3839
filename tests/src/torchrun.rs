//! A running `torchrun` (or any process of the torch venv whose stdout the caller follows):
//! its lines arrive on a channel as they are printed, so that a test can wait (bounded) for a
//! training step, kill the whole node at that moment, and read what every rank printed after.

use std::io::BufRead;
use std::process::Command;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::torch::{Guarded, Torch};

/// What one torchrun node is started with: its shape, its c10d rendezvous on the store at
/// `endpoint` (`--rdzv-conf` `conf`, e.g. `is_host=false`), torchrun's `extra` flags, and the
/// training script (`tests/torch/train.py`) for `steps` steps.
pub struct NodeArgs<'a> {
    /// `--nnodes`, e.g. `1` or `2:3`.
    pub nnodes: &'a str,
    pub nproc_per_node: u32,
    pub endpoint: &'a str,
    pub run_id: &'a str,
    pub conf: &'a str,
    pub extra: &'a [&'a str],
    pub steps: u64,
}

impl NodeArgs<'_> {
    /// torchrun's command line (monitoring every 0.5 s, so that a dead worker is seen at once).
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            format!("--nnodes={}", self.nnodes),
            format!("--nproc-per-node={}", self.nproc_per_node),
            "--rdzv-backend=c10d".into(),
            format!("--rdzv-endpoint={}", self.endpoint),
            format!("--rdzv-id={}", self.run_id),
            format!("--rdzv-conf={}", self.conf),
            "--monitor-interval=0.5".into(),
        ];
        args.extend(self.extra.iter().map(|s| s.to_string()));
        args.extend([
            Torch::script("train.py").display().to_string(),
            "--steps".into(),
            self.steps.to_string(),
        ]);
        args
    }
}

/// One node of two ranks, on the store at `store` (a sidecar's), in rendezvous `run_id`, training
/// `steps` steps, restarting its workers up to 3 times.
pub fn torchrun_args(store: &str, run_id: &str, steps: u64) -> Vec<String> {
    NodeArgs {
        nnodes: "1",
        nproc_per_node: 2,
        endpoint: store,
        run_id,
        conf: "is_host=false",
        extra: &["--max-restarts=3"],
        steps,
    }
    .to_args()
}

/// The steps a torchrun job reported and its result, once it exited 0 (within 300 s).
pub fn finished(job: &mut Launched) -> (Vec<u64>, String) {
    assert_eq!(
        job.finish(Duration::from_secs(300)),
        Some(0),
        "{}",
        job.seen.join("\n")
    );
    job.steps_and_result()
}

/// A started process (in a process group of its own: torchrun, its workers and their helpers),
/// killed with its group when dropped.
pub struct Launched {
    proc: Guarded,
    lines: Receiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Launched {
    /// Starts the venv's `torchrun` with `args`.
    pub fn start(torch: &Torch, args: &[String]) -> Launched {
        let mut cmd = torch.command("torchrun");
        cmd.args(args);
        Self::spawn(cmd)
    }

    /// Starts `cmd`, made by [`Torch::command`] (stdout piped, a process group of its own).
    pub fn spawn(mut cmd: Command) -> Launched {
        let mut proc = Guarded {
            child: cmd.spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}")),
        };
        let stdout = proc.child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Launched {
            proc,
            lines,
            seen: Vec::new(),
        }
    }

    /// The process's id (and its process group's).
    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// Waits (bounded) for a line starting with `prefix`; `Err` says what was seen instead.
    pub fn try_wait_for(&mut self, prefix: &str, timeout: Duration) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.starts_with(prefix);
                    self.seen.push(l.clone());
                    if hit {
                        return Ok(l);
                    }
                }
                Err(e) => {
                    return Err(format!(
                        "no {prefix:?} within {timeout:?} ({e}); output:\n{}",
                        self.seen.join("\n")
                    ))
                }
            }
        }
    }

    /// Waits (bounded) for a line starting with `prefix`; panics past `timeout`.
    pub fn wait_for(&mut self, prefix: &str, timeout: Duration) -> String {
        self.try_wait_for(prefix, timeout)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Reads the lines printed so far without waiting.
    pub fn drain(&mut self) {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
    }

    /// The exit code if the process has ended (`Some(None)`: killed by a signal).
    pub fn exited(&mut self) -> Option<Option<i32>> {
        self.drain();
        match self.proc.child.try_wait() {
            Ok(Some(s)) => Some(s.code()),
            _ => None,
        }
    }

    /// kill -9 of the process, its group and every process under it: torchrun starts each
    /// worker in a session of its own, so the group alone would leave the workers running. A
    /// node dying.
    pub fn kill(&mut self) {
        kill_tree(self.pid());
        self.proc.kill();
    }

    /// Waits (bounded) for the exit; its code, with every line of output read. Panics past
    /// `timeout`.
    pub fn finish(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        let code = loop {
            if let Some(code) = self.exited() {
                break code;
            }
            assert!(
                Instant::now() < deadline,
                "still running after {timeout:?}; output:\n{}",
                self.seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // Helpers left behind would hold stdout open.
        self.kill();
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        code
    }

    /// Every step rank 0 printed (`step N ...`, from `tests/torch/train.py`), in order, and the
    /// result line.
    pub fn steps_and_result(&self) -> (Vec<u64>, String) {
        let steps = self
            .seen
            .iter()
            .filter_map(|l| l.strip_prefix("step "))
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect();
        let result = self
            .seen
            .iter()
            .find_map(|l| l.strip_prefix("result "))
            .unwrap_or_else(|| panic!("no result line in:\n{}", self.seen.join("\n")))
            .to_string();
        (steps, result)
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        // Before the guard kills the group: once torchrun is gone its workers cannot be found.
        if self.exited().is_none() {
            kill_tree(self.pid());
        }
    }
}

/// The parent of each process, from `/proc`.
fn parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
            let (_, rest) = stat.rsplit_once(')')?;
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// kill -9 of `root`, every process descended from it, and each one's process group.
pub fn kill_tree(root: u32) {
    let parents = parents();
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    // One `kill` for all, so that the node dies at once; a group that does not exist is only
    // reported by `kill`.
    let targets = tree.iter().flat_map(|p| [p.to_string(), format!("-{p}")]);
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--"])
        .args(targets)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

//! `link-worker` processes for the rendezvous tests and benchmark: started on a free loopback
//! port, their stdout lines collected with the time each arrived, killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::cluster::workspace_binary;

/// Flags for workers 1 and 2 watching each other at the settings: 1 s heartbeats, dead
/// after 1.5 s of silence.
pub const WATCH_PAIR: [&str; 6] = [
    "--watch",
    "1,2",
    "--heartbeat-ms",
    "1000",
    "--peer-timeout-ms",
    "1500",
];

/// One stdout line and when the driver read it.
pub type Line = (Instant, String);

pub struct LinkWorker {
    pub task_id: u32,
    child: Option<Child>,
    lines: Arc<Mutex<Vec<Line>>>,
}

impl LinkWorker {
    /// Starts task `task_id` of job `worker` against the ensemble at `endpoints`, with `args`
    /// (`--role`, `--partner`, `--watch`, …) added.
    pub fn start(endpoints: &[String], task_id: u32, args: &[&str]) -> Self {
        let mut child = Command::new(workspace_binary("link-worker", None))
            .args(["--coordinators", &endpoints.join(",")])
            .args(["--task-id", &task_id.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .env("RUST_LOG", "warn")
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn link-worker");
        let lines = Arc::new(Mutex::new(Vec::new()));
        if let Some(out) = child.stdout.take() {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    lines
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((Instant::now(), line));
                }
            });
        }
        Self {
            task_id,
            child: Some(child),
            lines,
        }
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<Line> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The first line starting with `prefix`, waiting up to `timeout` for it.
    pub fn wait_line(&self, prefix: &str, timeout: Duration) -> Option<Line> {
        self.wait_any(&[prefix], timeout)
    }

    /// The first line starting with any of `prefixes`, waiting up to `timeout` for one.
    pub fn wait_any(&self, prefixes: &[&str], timeout: Duration) -> Option<Line> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self
                .lines()
                .into_iter()
                .find(|(_, l)| prefixes.iter().any(|p| l.starts_with(p)))
            {
                return Some(l);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The JSON of the `DONE` line, waiting up to `timeout`; panics naming the worker otherwise.
    pub fn done(&self, timeout: Duration) -> serde_json::Value {
        let (_, line) = self.wait_line("DONE ", timeout).unwrap_or_else(|| {
            panic!(
                "link-worker task {} did not finish within {timeout:?}; its output: {:?}",
                self.task_id,
                self.lines()
            )
        });
        serde_json::from_str(line.trim_start_matches("DONE ")).expect("DONE json")
    }

    /// Lines starting with `prefix`.
    pub fn lines_with(&self, prefix: &str) -> Vec<String> {
        self.lines()
            .into_iter()
            .filter(|(_, l)| l.starts_with(prefix))
            .map(|(_, l)| l)
            .collect()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// kill -9, and the moment it was sent.
    pub fn kill(&mut self) -> Instant {
        let at = Instant::now();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        at
    }

    /// Waits up to `timeout` for the process to exit by itself; its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for LinkWorker {
    fn drop(&mut self) {
        self.kill();
    }
}

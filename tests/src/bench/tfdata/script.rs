//! One process of `tests/tfdata/tf_bench.py`: its JSON events as they come, its stdin, its stderr tail.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::venv::Guarded;

use super::harness::{lock, wall, STDERR_TAIL};

/// One process of `tf_bench.py`, its own process group (killed with it when dropped): its JSON
/// events as they come (and whether its output ended), its stdin (closing it ends the process)
/// and its stderr, kept in an unnamed temp file for the message of a failure.
pub(super) struct Script {
    pub(super) what: String,
    pub(super) proc: Guarded,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) events: Arc<Mutex<(Vec<Value>, bool)>>,
    pub(super) stderr: std::fs::File,
}

impl Script {
    pub(super) fn start(python: &Path, args: &[&str], what: &str) -> Result<Script, String> {
        let stderr = tempfile::tempfile().map_err(|e| format!("{what}: stderr file: {e}"))?;
        let mut cmd = Command::new(python);
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tfdata/tf_bench.py"))
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr.try_clone().map_err(|e| e.to_string())?)
            .process_group(0);
        let mut proc = Guarded {
            child: cmd
                .spawn()
                .map_err(|e| format!("{what}: cannot start: {e}"))?,
        };
        let (stdin, stdout) = (proc.child.stdin.take(), proc.child.stdout.take());
        let stdout = stdout.ok_or_else(|| format!("{what}: no stdout pipe"))?;
        let events = Arc::new(Mutex::new((Vec::new(), false)));
        let sink = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    lock(&sink).0.push(v);
                }
            }
            lock(&sink).1 = true;
        });
        let what = what.to_string();
        Ok(Script {
            what,
            proc,
            stdin,
            events,
            stderr,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    pub(super) fn send(&mut self, line: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        }
    }

    /// The first event `pick` takes; `Err` (with its stderr's end) if the process reported an
    /// error, its output ended, or `timeout` passed.
    pub(super) async fn wait<T>(
        &self,
        awaited: &str,
        timeout: Duration,
        pick: impl Fn(&Value) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let why = {
                let g = lock(&self.events);
                if let Some(t) = g.0.iter().find_map(&pick) {
                    return Ok(t);
                }
                let error = g.0.iter().find(|e| e["event"] == "error");
                let error = error.map(|e| format!("it failed: {} {}", e["code"], e["message"]));
                error.or_else(|| g.1.then(|| "its output ended".into()))
            };
            let why = why.or_else(|| (Instant::now() > deadline).then(|| "timed out".into()));
            if let Some(why) = why {
                tokio::time::sleep(Duration::from_millis(200)).await;
                // Opened again through /proc: a file description of its own, read from the start.
                let path = format!("/proc/self/fd/{}", self.stderr.as_raw_fd());
                let text = std::fs::read(path).unwrap_or_default();
                let (what, tail) = (&self.what, crate::venv::tail(&text, STDERR_TAIL));
                return Err(format!(
                    "{what}: no {awaited} ({why}); its stderr ended:\n{tail}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(super) async fn event(&self, event: &str, timeout: Duration) -> Result<Value, String> {
        let pick = |e: &Value| (e["event"] == event).then(|| e.clone());
        self.wait(event, timeout, pick).await
    }

    /// kill -9 of the process (then of its group); returns the wall time just before.
    pub(super) fn kill(&mut self) -> f64 {
        let at = wall();
        let _ = self.proc.child.kill();
        self.proc.kill();
        at
    }
}

/// TF's `DispatchServer` on `port` over the journal in `dir`; `standby`: imports TF and waits
/// for "go".
pub(super) fn tf_dispatcher(
    python: &Path,
    port: u16,
    dir: &Path,
    standby: bool,
) -> Result<Script, String> {
    let (port, dir) = (port.to_string(), dir.display().to_string());
    let mut args = vec!["dispatcher", "--port", &port, "--work-dir", &dir];
    if standby {
        args.push("--standby");
    }
    Script::start(python, &args, &format!("TF dispatcher on port {port}"))
}

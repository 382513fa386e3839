//! One process of `tests/tfdata/tf_service.py`: its JSON events collected as they come, its
//! stdin held (closing it ends the process), the tail of its stderr kept for the message of a
//! failure, and waits on its events with deadlines.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::venv::Guarded;

/// Lines of a process's stderr kept for the message of a failure.
pub(super) const STDERR_TAIL: usize = 30;

/// Lines kept from a Python crash's report on (`faulthandler`: every thread's stack) onwards.
const CRASH_TAIL: usize = 2_000;

/// Set to pass every line the Python processes write to stderr (TF's logs) on to ours.
pub const ECHO_STDERR_ENV: &str = "COORD_TEST_TF_STDERR";

/// How often a wait looks at the events again.
const POLL: Duration = Duration::from_millis(20);

/// One process of the script: its events, its stdin (closing it ends the process), its stderr.
pub(super) struct ScriptProc {
    pub(super) what: String,
    pub(super) proc: Mutex<Guarded>,
    pub(super) stdin: Mutex<Option<ChildStdin>>,
    pub(super) events: Arc<Mutex<Vec<Value>>>,
    /// Set when its stdout closed: no event will come any more.
    pub(super) ended: Arc<AtomicBool>,
    pub(super) stderr: Arc<Mutex<VecDeque<String>>>,
    /// Every line TensorFlow logged at ERROR or FATAL (`E...`/`F...` in its log format).
    pub(super) logged_errors: Arc<Mutex<Vec<String>>>,
}

/// Whether a line of TF's stderr is an error of its log (`E1126 12:00:00.000 ...` or absl's
/// `E0000 00:00:...`).
fn is_logged_error(line: &str) -> bool {
    let mut chars = line.chars();
    matches!(chars.next(), Some('E' | 'F')) && chars.take(4).all(|c| c.is_ascii_digit())
}

/// The script every process runs: `tests/tfdata/tf_service.py`.
pub(super) fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tfdata")
        .join("tf_service.py")
}

impl ScriptProc {
    pub(super) fn spawn(python: &Path, args: &[String], what: String) -> ScriptProc {
        let mut cmd = Command::new(python);
        cmd.arg(script())
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot start {}: {e}", python.display()));
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            panic!("{what}: no pipes to the child");
        };
        let events = Arc::new(Mutex::new(Vec::new()));
        let ended = Arc::new(AtomicBool::new(false));
        let (sink, done) = (events.clone(), ended.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    lock(&sink).push(v);
                }
            }
            done.store(true, Ordering::SeqCst);
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let (keep, echo) = (tail.clone(), std::env::var_os(ECHO_STDERR_ENV).is_some());
        let logged_errors = Arc::new(Mutex::new(Vec::new()));
        let errors = logged_errors.clone();
        let name = what.clone();
        std::thread::spawn(move || {
            let mut crashed = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("[{name}] {line}");
                }
                if is_logged_error(&line) {
                    lock(&errors).push(line.clone());
                }
                crashed |= line.starts_with("Fatal Python error");
                let mut t = lock(&keep);
                if t.len() >= if crashed { CRASH_TAIL } else { STDERR_TAIL } {
                    t.pop_front();
                }
                t.push_back(line);
            }
        });
        ScriptProc {
            what,
            proc: Mutex::new(Guarded { child }),
            stdin: Mutex::new(Some(stdin)),
            events,
            ended,
            stderr: tail,
            logged_errors,
        }
    }

    pub(super) fn events(&self) -> Vec<Value> {
        lock(&self.events).clone()
    }

    pub(super) fn stderr_tail(&self) -> String {
        Vec::from(lock(&self.stderr).clone()).join("\n")
    }

    /// A failure of the harness: panics naming the process, with `why` and its stderr.
    pub(super) fn fail(&self, why: &str) -> ! {
        // Its last lines of stderr may still be on the way.
        std::thread::sleep(Duration::from_millis(200));
        panic!(
            "{}: {why}; its events: {}; its stderr ended:\n{}",
            self.what,
            abbreviate(&self.events()),
            self.stderr_tail()
        )
    }

    /// The first event for which `pick` returns `Some`, once it came; panics at `timeout`, or
    /// when the process's output ended without one (`awaited` names it in the message).
    pub(super) async fn wait_for<T>(
        &self,
        awaited: &str,
        timeout: Duration,
        pick: impl Fn(&Value) -> Option<T>,
    ) -> T {
        self.try_wait_for(timeout, pick)
            .await
            .unwrap_or_else(|why| self.fail(&format!("no {awaited} ({why})")))
    }

    /// As [`ScriptProc::wait_for`], but `Err` when the wait failed.
    pub(super) async fn try_wait_for<T>(
        &self,
        timeout: Duration,
        pick: impl Fn(&Value) -> Option<T>,
    ) -> Result<T, String> {
        let deadline = Instant::now() + timeout;
        loop {
            // Read `ended` before the events: an event printed before the end is then seen.
            let ended = self.ended.load(Ordering::SeqCst);
            if let Some(t) = lock(&self.events).iter().find_map(&pick) {
                return Ok(t);
            }
            if ended {
                let status = lock(&self.proc).child.try_wait().ok().flatten();
                return Err(format!("its output ended; exit status {status:?}"));
            }
            if Instant::now() >= deadline {
                return Err(format!("still waiting after {timeout:?}"));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Sends `line` to the process's stdin (ignored if it already exited).
    pub(super) fn send(&self, line: &str) {
        if let Some(stdin) = lock(&self.stdin).as_mut() {
            let _ = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        }
    }

    /// kill -9 of the process's group.
    pub(super) fn kill(&self) {
        lock(&self.proc).kill();
        lock(&self.stdin).take();
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Events for a message, long element lists cut short.
fn abbreviate(events: &[Value]) -> String {
    let s = serde_json::to_string(events).unwrap_or_default();
    if s.len() > 2000 {
        let mut cut = 2000;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}... ({} bytes)", &s[..cut], s.len())
    } else {
        s
    }
}

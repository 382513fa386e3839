//! Unmodified TensorFlow jobs on the ensemble: `MultiWorkerMirroredStrategy` workers
//! (`tests/tf/mwms_worker.py`, in the venv of [`crate::tfdata`]) whose `TF_CONFIG` names the
//! ensemble as their coordination service, each a process whose JSON event lines are collected
//! as they come.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::venv::Guarded;

/// TensorFlow's Python, from the venv the tests make.
pub struct Tf {
    python: PathBuf,
}

/// What one worker of a job is told.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// Every worker's own gRPC address (MWMS's collectives go worker to worker).
    pub workers: Vec<String>,
    pub index: usize,
    /// Where its coordination service is: a replica, or a coord-proxy sidecar.
    pub coordinator: String,
    pub steps: u32,
    pub step_sleep: Duration,
    /// Names the run's keys and barriers.
    pub run: String,
}

impl Tf {
    /// The venv, made if needed; `Err` says why it cannot be had here.
    pub fn get() -> Result<Tf, String> {
        Ok(Tf {
            python: crate::tfdata::tf_python()?,
        })
    }

    /// Starts a worker of `tests/tf/mwms_worker.py` in its own process group (killed with it
    /// when dropped).
    pub fn worker(&self, spec: &WorkerSpec) -> Worker {
        let args = [
            ("--steps", spec.steps.to_string()),
            ("--step-sleep", spec.step_sleep.as_secs_f64().to_string()),
            ("--run", spec.run.clone()),
        ];
        self.spawn_worker("mwms_worker.py", spec, &args)
    }

    /// Starts a worker of `tests/tf/preemption_worker.py`: it trains until `spec.steps` run
    /// calls in all (this run's and those restored from `checkpoint_dir`).
    pub fn preemption_worker(&self, spec: &WorkerSpec, checkpoint_dir: &Path) -> Worker {
        let args = [
            ("--steps", spec.steps.to_string()),
            ("--step-sleep", spec.step_sleep.as_secs_f64().to_string()),
            ("--checkpoint-dir", checkpoint_dir.display().to_string()),
        ];
        self.spawn_worker("preemption_worker.py", spec, &args)
    }

    fn spawn_worker(&self, script: &str, spec: &WorkerSpec, args: &[(&str, String)]) -> Worker {
        let mut all = vec![
            "--workers".to_string(),
            spec.workers.join(","),
            "--index".into(),
            spec.index.to_string(),
            "--coordinator".into(),
            spec.coordinator.clone(),
        ];
        for (flag, value) in args {
            all.extend([flag.to_string(), value.clone()]);
        }
        self.script(script, &all, spec.index)
    }

    /// Starts `tests/tf/<script>` with `args` in its own process group (killed with it when
    /// dropped); `index` names it in messages.
    pub fn script(&self, script: &str, args: &[String], index: usize) -> Worker {
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tf")
            .join(script);
        let mut cmd = Command::new(&self.python);
        cmd.arg(script)
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().expect("start python");
        let stdout = child.stdout.take().expect("piped stdout");
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    sink.lock().unwrap_or_else(PoisonError::into_inner).push(v);
                }
            }
        });
        Worker {
            index,
            proc: Guarded { child },
            events,
        }
    }
}

pub struct Worker {
    pub index: usize,
    proc: Guarded,
    events: Arc<Mutex<Vec<Value>>>,
}

impl Worker {
    /// Every event so far.
    pub fn events(&self) -> Vec<Value> {
        self.events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The first event named `name`, once it came; panics after `timeout` with what did come.
    pub async fn wait_event(&self, name: &str, timeout: Duration) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.events().into_iter().find(|e| e["event"] == name) {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "worker {} sent no {name:?} within {timeout:?}; it sent {:?}",
                self.index,
                self.events()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits for the process to exit (at most `timeout`); its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.proc.child.try_wait() {
                return status.code();
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    /// The worker's Python process.
    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// SIGTERM to the worker's Python process alone, as a cluster manager's preemption sends it.
    pub fn terminate(&self) {
        crate::cluster::send_signal(i64::from(self.proc.child.id()), "TERM");
    }

    /// kill -9 of the worker (and whatever it started).
    pub fn kill(&mut self) {
        self.proc.kill();
    }
}

/// The wall-clock time of an event (seconds since the epoch, as the worker stamped it).
pub fn wall(e: &Value) -> f64 {
    e["wall"].as_f64().unwrap_or(0.0)
}

//! Real TensorFlow tf.data service processes (`tests/tfdata/tf_service.py`, in the venv of
//! [`crate::tfdata`]) pointed at any dispatcher address: TF's own `DispatchServer`, TF's
//! `WorkerServer`s, and readers that `distribute()` a dataset and read it. The tests of coord's
//! `tensorflow.data.DispatcherService` run one scenario against TF's dispatcher and against a
//! coord ensemble with these same processes, so the two outcomes can be compared.
//!
//! Every process is its own process group, killed with it when its handle drops (and it exits by
//! itself when its stdin, held here, closes); its JSON event lines are collected as they come and
//! the tail of its stderr is kept for the message of a failure. Waits have deadlines, never fixed
//! sleeps. A failure of the harness (a process that died or sent nothing in time) panics with
//! that process's stderr; what TensorFlow answers, errors included, is returned.
//!
//! Modules, bottom up: `error` (what TensorFlow reported); [`proc`] (one script process and
//! its events); [`read`] (readers, what they read and what they got). This module starts the
//! processes.

mod error;
mod proc;
mod read;

pub use error::TfError;
pub use proc::ECHO_STDERR_ENV;
use proc::{ScriptProc, STDERR_TAIL};
use read::read_result;
pub use read::{DatasetKind, Mode, PreparedReaders, ReadResult, ReadSpec, Reader, Rewind};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
/// TensorFlow's Python, from the venv the tests make, and the script.
pub struct TfDataProcs {
    python: PathBuf,
}

/// TF's own dispatcher (`DispatchServer`, fault-tolerant mode, its journal in a temp dir).
pub struct TfDispatcher {
    /// `localhost:<port>`, as workers and clients are given it.
    pub address: String,
    proc: ScriptProc,
    /// Removed when the dispatcher is dropped (after the process: fields drop in order).
    _work_dir: tempfile::TempDir,
}

impl TfDispatcher {
    /// Waits until it serves; panics if it did not within `timeout`.
    pub async fn ready(&self, timeout: Duration) {
        self.proc
            .wait_for("ready", timeout, |e| (e["event"] == "ready").then_some(()))
            .await
    }

    /// kill -9 of the dispatcher.
    pub fn kill(&self) {
        self.proc.kill()
    }
}

/// A `WorkerServer` process on its way up: [`StartingWorker::started`] waits for the outcome.
pub struct StartingWorker {
    proc: ScriptProc,
}

impl StartingWorker {
    /// The worker, once it serves and the dispatcher took its first heartbeat; TF's error if the
    /// dispatcher refused it (`WorkerServer` raised). Panics if neither came within `timeout`.
    pub async fn started(self, timeout: Duration) -> Result<Worker, TfError> {
        let outcome = self
            .proc
            .wait_for("ready or error", timeout, |e| match e["event"].as_str() {
                Some("ready") => Some(Ok(e["address"].as_str().unwrap_or("").to_string())),
                Some("error") => Some(Err(TfError::from_event(e))),
                _ => None,
            })
            .await;
        let address = outcome?;
        Ok(Worker {
            address,
            proc: self.proc,
        })
    }

    /// As [`StartingWorker::started`], panicking if TF refused the worker.
    pub async fn ready(self, timeout: Duration) -> Worker {
        let what = self.proc.what.clone();
        match self.started(timeout).await {
            Ok(w) => w,
            Err(e) => panic!("{what} was refused: {e}"),
        }
    }
}

/// A running `WorkerServer`.
pub struct Worker {
    /// The `worker_address` it registered with (`localhost:<port>`).
    pub address: String,
    proc: ScriptProc,
}

impl Worker {
    /// When it reported ready (seconds since the epoch, its clock: this machine's).
    pub fn ready_wall(&self) -> f64 {
        self.proc
            .events()
            .iter()
            .find(|e| e["event"] == "ready")
            .and_then(|e| e["wall"].as_f64())
            .unwrap_or(0.0)
    }

    /// kill -9 of the worker.
    pub fn kill(&self) {
        self.proc.kill()
    }

    /// Every error TensorFlow logged in the worker's process so far.
    pub fn errors(&self) -> Vec<String> {
        proc::lock(&self.proc.logged_errors).clone()
    }
}

/// Calls of TF's client with bad input, run by [`TfDataProcs::bad_input`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadInput {
    /// `from_dataset_id` with a dataset id nobody registered.
    UnknownDatasetId,
    /// Two `distribute()` with one job name: OFF, then DYNAMIC.
    JobModeMismatch,
    /// One job name, `num_consumers` 2 (consumer 0) then 3 (consumer 1), 4 elements each.
    ConsumersMismatch,
    /// `num_consumers=2` on a finite dataset.
    RoundRobinFinite,
    /// FILE_OR_DATA sharding, meant for a dispatcher without `worker_addresses`.
    StaticUnconfigured,
}

impl BadInput {
    pub const ALL: [BadInput; 5] = [
        BadInput::UnknownDatasetId,
        BadInput::JobModeMismatch,
        BadInput::ConsumersMismatch,
        BadInput::RoundRobinFinite,
        BadInput::StaticUnconfigured,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            BadInput::UnknownDatasetId => "unknown-dataset-id",
            BadInput::JobModeMismatch => "job-mode-mismatch",
            BadInput::ConsumersMismatch => "consumers-mismatch",
            BadInput::RoundRobinFinite => "round-robin-finite",
            BadInput::StaticUnconfigured => "static-unconfigured",
        }
    }
}

/// What each call of a [`BadInput`] case got: its elements, or TF's error.
pub type CallOutcome = Result<Vec<i64>, TfError>;

impl TfDataProcs {
    /// The venv, made if needed; `Err` says why it cannot be had here.
    pub fn get() -> Result<TfDataProcs, String> {
        Ok(TfDataProcs {
            python: crate::tfdata::tf_python()?,
        })
    }

    /// `tests/tfdata/tf_service.py`.
    pub fn script() -> PathBuf {
        proc::script()
    }

    fn spawn(&self, args: &[String], what: String) -> ScriptProc {
        ScriptProc::spawn(&self.python, args, what)
    }

    /// Starts TF's own dispatcher on a free port, configured with `worker_addresses` (needed by
    /// the static sharding modes; empty: any worker may join); its address is known at once, and
    /// [`TfDispatcher::ready`] waits until it serves.
    pub fn own_dispatcher(&self, worker_addresses: &[String]) -> TfDispatcher {
        let port = crate::cluster::free_ports(1)[0];
        let work_dir = tempfile::Builder::new()
            .prefix("tf-dispatcher-")
            .tempdir()
            .unwrap_or_else(|e| panic!("a temp dir for TF's dispatcher: {e}"));
        let mut args = vec![
            "dispatcher".to_string(),
            "--port".into(),
            port.to_string(),
            "--work-dir".into(),
            work_dir.path().display().to_string(),
        ];
        if !worker_addresses.is_empty() {
            args.extend(["--worker-addresses".into(), worker_addresses.join(",")]);
        }
        TfDispatcher {
            address: format!("localhost:{port}"),
            proc: self.spawn(&args, format!("TF dispatcher on port {port}")),
            _work_dir: work_dir,
        }
    }

    /// Starts a `WorkerServer` of `dispatcher` on `port` (a free one if `None`), heartbeating
    /// every 500 ms.
    pub fn start_worker(&self, dispatcher: &str, port: Option<u16>) -> StartingWorker {
        let port = port.unwrap_or_else(|| crate::cluster::free_ports(1)[0]);
        let args = [
            "worker".to_string(),
            "--dispatcher".into(),
            dispatcher.to_string(),
            "--port".into(),
            port.to_string(),
            "--heartbeat-ms".into(),
            "500".into(),
        ];
        StartingWorker {
            proc: self.spawn(&args, format!("TF worker on port {port}")),
        }
    }

    /// One worker per port, all started at once; returns when all are up.
    pub async fn workers(&self, dispatcher: &str, ports: &[u16], timeout: Duration) -> Vec<Worker> {
        let starting: Vec<StartingWorker> = ports
            .iter()
            .map(|&p| self.start_worker(dispatcher, Some(p)))
            .collect();
        let mut workers = Vec::with_capacity(starting.len());
        for s in starting {
            workers.push(s.ready(timeout).await);
        }
        workers
    }

    /// Writes `files` TFRecord files into `dir` whose records are 8-byte little-endian int64s:
    /// record r of file f holds f*records+r. Returns their paths (TF's import is not needed, so
    /// this takes a moment).
    pub fn make_files(&self, dir: &Path, files: u32, records: u32) -> Vec<PathBuf> {
        let out = Command::new(&self.python)
            .arg(Self::script())
            .args(["make-files", "--dir"])
            .arg(dir)
            .args([
                "--files",
                &files.to_string(),
                "--records",
                &records.to_string(),
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("make-files: cannot start python: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let event = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["event"] == "files");
        match event {
            Some(e) if out.status.success() => e["paths"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(PathBuf::from)
                .collect(),
            _ => panic!(
                "make-files into {}: {}; stdout {stdout}; stderr {}",
                dir.display(),
                out.status,
                crate::venv::tail(&out.stderr, STDERR_TAIL)
            ),
        }
    }

    /// Starts one reader process for `specs` (a thread each) that imports TF and then waits:
    /// start it while the servers start, and [`PreparedReaders::go`] once they are up.
    pub fn prepare_readers(&self, specs: &[ReadSpec]) -> PreparedReaders {
        let json = Value::Array(specs.iter().map(ReadSpec::to_json).collect());
        let args = ["read".to_string(), "--specs".into(), json.to_string()];
        let what = match specs {
            [one] => format!("TF reader ({})", one.label()),
            _ => format!("TF readers ({} specs)", specs.len()),
        };
        PreparedReaders {
            proc: Arc::new(self.spawn(&args, what)),
            specs: specs.to_vec(),
        }
    }

    /// Readers of `specs` against `dispatcher`, reading as soon as TF is imported.
    pub fn readers(&self, dispatcher: &str, specs: &[ReadSpec]) -> Vec<Reader> {
        self.prepare_readers(specs).go(dispatcher)
    }

    /// One reader of `spec` against `dispatcher`.
    pub fn reader(&self, dispatcher: &str, spec: &ReadSpec) -> Reader {
        self.readers(dispatcher, std::slice::from_ref(spec))
            .pop()
            .unwrap_or_else(|| unreachable!("one spec, one reader"))
    }

    /// Runs each case against `dispatcher` (one after another, in one process); for each, what
    /// every call in it got. A call that has not returned after `call_timeout` counts as the
    /// error `HUNG`.
    pub async fn bad_input(
        &self,
        dispatcher: &str,
        cases: &[BadInput],
        call_timeout: Duration,
    ) -> Vec<(BadInput, Vec<CallOutcome>)> {
        let names: Vec<&str> = cases.iter().map(|c| c.as_str()).collect();
        let args = [
            "bad-input".to_string(),
            "--dispatcher".into(),
            dispatcher.to_string(),
            "--cases".into(),
            names.join(","),
            "--case-timeout".into(),
            call_timeout.as_secs_f64().to_string(),
        ];
        let proc = self.spawn(&args, "TF bad-input client".into());
        // TF's import, then at worst every call hangs to its timeout (a case makes two).
        let timeout = Duration::from_secs(180) + call_timeout * 2 * cases.len() as u32;
        proc.wait_for("finished", timeout, |e| {
            (e["event"] == "finished").then_some(())
        })
        .await;
        let events = proc.events();
        cases
            .iter()
            .map(|&case| {
                let results = events
                    .iter()
                    .find(|e| e["event"] == "case" && e["case"] == case.as_str())
                    .and_then(|e| e["results"].as_array())
                    .unwrap_or_else(|| proc.fail(&format!("no result for {}", case.as_str())))
                    .iter()
                    .map(|r| {
                        if r["ok"] == true {
                            Ok(read_result(r).elements)
                        } else {
                            Err(TfError::from_event(r))
                        }
                    })
                    .collect();
                (case, results)
            })
            .collect()
    }
}

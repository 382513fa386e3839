//! TensorFlow's own tf.data service, the peer that coord-bench measures coord's dispatcher
//! against in the same run: a venv with `tensorflow-cpu` from PyPI and `tests/tfdata/tf_peer.py`.
//!
//! The venv is made once per target directory (`target/tf-venv-<version>`, under a file lock
//! shared by concurrent processes, see [`crate::venv`]). Where it cannot be made (no CPython 3.11,
//! PyPI out of reach), [`TfPeer::get`] says why, and the benchmark reports no peer with that reason.
//!
//! What is measured (the script's docstring has the details):
//! - [`TfPeer::split_throughput`]: dynamic sharding (`distributed_epoch`) of `range(splits)` over
//!   `workers` workers, one split per element, each split journaled (fault-tolerant mode) by TF's
//!   dispatcher before it is handed out; timed from the first element at the client to the last,
//!   after an untimed warm-up run on the same servers; the elements are checked to be exactly
//!   `0..splits`. The dispatcher runs in a process of its own, the workers in another, the client
//!   in a third.
//! - [`TfPeer::restore`]: a journal of about `updates` updates (one `ProduceSplit` per split of a
//!   `distributed_epoch` read), the dispatcher killed, then a new dispatcher on the same work dir
//!   timed from its construction until it has replayed the journal and started serving (and,
//!   separately, until it answered a client RPC).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::venv::{Guarded, VenvSpec, CPYTHON_3_11};

/// The TensorFlow release the peer runs (`tensorflow-cpu`; PyPI has cp311 manylinux wheels).
pub const TF_VERSION: &str = "2.21.0";

/// Lines of the script's stderr kept for an error message.
const STDERR_TAIL: usize = 25;

/// The Python of the venv with `tensorflow-cpu` [`TF_VERSION`], made if needed; `Err` says why it
/// cannot be had here.
pub fn tf_python() -> Result<PathBuf, String> {
    VenvSpec {
        dir_name: &format!("tf-venv-{TF_VERSION}"),
        interpreter: CPYTHON_3_11,
        requirements: &[format!("tensorflow-cpu=={TF_VERSION}")],
        describe: &format!("tensorflow-cpu {TF_VERSION}"),
        short: &format!("tensorflow-cpu {TF_VERSION}"),
        marker: TF_VERSION,
    }
    .python()
}

pub struct TfPeer {
    python: PathBuf,
}

/// One [`TfPeer::split_throughput`] run.
#[derive(Clone, Debug)]
pub struct SplitRun {
    pub workers: usize,
    pub splits: u64,
    /// From the first element's arrival at the client to the last one's.
    pub seconds: f64,
    /// Splits that arrived after the first batch (256) over `seconds`.
    pub splits_per_sec: f64,
}

/// One [`TfPeer::restore`] run.
#[derive(Clone, Debug)]
pub struct RestoreRun {
    /// The journal's records, counted (the number asked for, if they could not be counted).
    pub updates: u64,
    pub journal_bytes: u64,
    pub journal_files: u64,
    /// From the new dispatcher's construction until it is restored and serving
    /// (`DispatchServer(start=True)` returned: the journal replayed, the split providers
    /// fast-forwarded, the dispatcher marked started; it refuses RPCs until then).
    pub restore_seconds: f64,
    /// From its construction until a client RPC (`register_dataset`) was answered: adds the
    /// client's cost (gRPC channel, one journal write), which does not grow with the journal.
    pub answered_seconds: f64,
}

impl TfPeer {
    /// The venv, made if needed; `Err` says why it cannot be had here (no python3.11, PyPI
    /// unreachable...).
    pub fn get() -> Result<TfPeer, String> {
        Ok(TfPeer {
            python: tf_python()?,
        })
    }

    /// `tests/tfdata/tf_peer.py`.
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tfdata")
            .join("tf_peer.py")
    }

    /// Dynamic-sharding throughput of TF's dispatcher: `splits` splits over `workers` workers.
    pub fn split_throughput(&self, workers: usize, splits: u64) -> Result<SplitRun, String> {
        let args = [
            "splits".to_string(),
            "--workers".to_string(),
            workers.to_string(),
            "--splits".to_string(),
            splits.to_string(),
        ];
        // Start-up of the three processes (TF's import is seconds each on two cores), then at
        // worst a few hundred splits a second.
        let timeout = Duration::from_secs(180 + splits / 200);
        let v = self.run_json(&args, timeout)?;
        Ok(SplitRun {
            workers: get_u64(&v, "workers")? as usize,
            splits: get_u64(&v, "splits")?,
            seconds: get_f64(&v, "seconds")?,
            splits_per_sec: get_f64(&v, "splits_per_sec")?,
        })
    }

    /// Restore time of TF's dispatcher from a journal of about `updates` updates.
    pub fn restore(&self, updates: u64) -> Result<RestoreRun, String> {
        let args = [
            "restore".to_string(),
            "--updates".to_string(),
            updates.to_string(),
        ];
        // Making the journal runs at ~2k splits/s here; allow for a machine four times slower.
        let timeout = Duration::from_secs(180 + updates / 500);
        let v = self.run_json(&args, timeout)?;
        let updates = match v.get("updates_exact").and_then(Value::as_u64) {
            Some(n) => n,
            None => get_u64(&v, "updates_approx")?,
        };
        Ok(RestoreRun {
            updates,
            journal_bytes: get_u64(&v, "journal_bytes")?,
            journal_files: get_u64(&v, "journal_files")?,
            restore_seconds: get_f64(&v, "restore_seconds")?,
            answered_seconds: get_f64(&v, "answered_seconds")?,
        })
    }

    /// Runs the script with `args` in its own process group (killed, with the dispatcher and
    /// workers it started, at `timeout` or if this thread unwinds), and parses the JSON object on
    /// the last line of its stdout. Its progress lines (`tf_peer: ...`) are passed on to stderr;
    /// the tail of its stderr goes into the error when it fails.
    fn run_json(&self, args: &[String], timeout: Duration) -> Result<Value, String> {
        let mut cmd = Command::new(&self.python);
        cmd.arg(Self::script())
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            .env("TF_CPP_MIN_LOG_LEVEL", "2")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.python.display()))?;
        let mut g = Guarded { child };
        let what = format!("tf_peer.py {}", args.join(" "));
        let mut stdout = g.child.stdout.take().ok_or("no stdout pipe")?;
        let stderr = g.child.stderr.take().ok_or("no stderr pipe")?;
        let out_reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err_reader = std::thread::spawn(move || {
            let mut last: std::collections::VecDeque<String> = Default::default();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("tf_peer: ") {
                    eprintln!("{line}");
                }
                if last.len() == STDERR_TAIL {
                    last.pop_front();
                }
                last.push_back(line);
            }
            Vec::from(last).join("\n")
        });
        let deadline = Instant::now() + timeout;
        let status = loop {
            match g.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) => {}
                Err(e) => return Err(format!("{what}: wait: {e}")),
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // The script's children exit when their stdin (a pipe from the script) closes; kill the
        // group all the same, so that nothing holds the pipes open.
        g.kill();
        let stdout = out_reader.join().unwrap_or_default();
        let stderr = err_reader.join().unwrap_or_default();
        let Some(status) = status else {
            return Err(format!(
                "{what}: still running after {timeout:?}, killed; its stderr ended:\n{stderr}"
            ));
        };
        let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
        let parsed = last.map(serde_json::from_str::<Value>);
        match parsed {
            Some(Ok(v)) if v.is_object() => {
                if let Some(e) = v.get("error") {
                    let e = e.as_str().map_or_else(|| e.to_string(), str::to_string);
                    Err(format!("{what}: {e}; its stderr ended:\n{stderr}"))
                } else if !status.success() {
                    Err(format!("{what}: {status}; its stderr ended:\n{stderr}"))
                } else {
                    Ok(v)
                }
            }
            _ => Err(format!(
                "{what}: {status}, no JSON object on its last line of output ({:?}); its stderr \
                 ended:\n{stderr}",
                last.unwrap_or("")
            )),
        }
    }
}

fn get_f64(v: &Value, key: &str) -> Result<f64, String> {
    v.get(key)
        .and_then(Value::as_f64)
        .ok_or_else(|| format!("tf_peer.py's output has no number {key:?}: {v}"))
}

fn get_u64(v: &Value, key: &str) -> Result<u64, String> {
    v.get(key)
        .and_then(Value::as_u64)
        .ok_or_else(|| format!("tf_peer.py's output has no count {key:?}: {v}"))
}

//! The tf.data service scenarios that coord's `tensorflow.data.DispatcherService` is held to:
//! each takes the address of the dispatcher under test and starts real TensorFlow workers and
//! readers itself ([`crate::tf_service`]), so the same scenario runs against TensorFlow's own
//! `DispatchServer` and against a coord ensemble, and the outcomes are compared ([`summary`]);
//! each has a check of what TensorFlow itself guarantees.
//!
//! - [`modes`]: every processing mode on every dataset kind, and round-robin consumers.
//! - [`joins`]: a worker added to running round-robin and plain jobs.
//! - [`bad`]: TF's client with bad input.

pub mod bad;
pub mod joins;
pub mod modes;

use std::path::PathBuf;
use std::time::Duration;

use crate::tf_service::{DatasetKind, ReadResult, ReadSpec, TfDataProcs, TfError};

/// TF's import takes seconds per process, and a scenario starts several at once on two cores.
pub const START_PATIENCE: Duration = Duration::from_secs(240);
/// A read of a few dozen elements, once the servers are up.
pub const READ_PATIENCE: Duration = Duration::from_secs(120);
/// A worker added to a running job must be read from within this (TF: ~1–3 s).
pub const ADDED_WORKER_BOUND: Duration = Duration::from_secs(15);

/// Worker addresses as TF's workers register them (`localhost:%port%`).
pub fn localhost(ports: &[u16]) -> Vec<String> {
    ports.iter().map(|p| format!("localhost:{p}")).collect()
}

/// TFRecord files of [`TfDataProcs::make_files`]: record r of file f holds f*records+r.
pub struct FileSet {
    dir: PathBuf,
    files: usize,
    records: usize,
}

/// The file sets the file-based readers read, in a temp dir.
pub struct TestFiles {
    _dir: tempfile::TempDir,
    /// More files than any test has workers: 6 files of 5 records.
    many: FileSet,
    /// Fewer files than 3 or 4 workers: 2 files of 3 records.
    few: FileSet,
}

impl TestFiles {
    pub fn make(procs: &TfDataProcs) -> TestFiles {
        let dir = tempfile::tempdir().expect("temp dir");
        let set = |name: &str, files: usize, records: usize| {
            let set = FileSet {
                dir: dir.path().join(name),
                files,
                records,
            };
            procs.make_files(&set.dir, files as u32, records as u32);
            set
        };
        let (many, few) = (set("many", 6, 5), set("few", 2, 3));
        TestFiles {
            _dir: dir,
            many,
            few,
        }
    }

    /// The file set `kind` reads, if it reads files.
    pub fn set(&self, kind: &DatasetKind) -> Option<&FileSet> {
        match kind {
            DatasetKind::Files(dir) => [&self.many, &self.few].into_iter().find(|s| s.dir == *dir),
            _ => None,
        }
    }

    /// The elements of one epoch of `kind`, in increasing order.
    pub fn epoch(&self, kind: &DatasetKind) -> Vec<i64> {
        let n = match (kind, self.set(kind)) {
            (DatasetKind::Range(n) | DatasetKind::Slices(n), _) => *n as usize,
            (_, Some(set)) => set.files * set.records,
            (_, None) => panic!("{kind:?} is none of the test's file sets"),
        };
        (0..n as i64).collect()
    }
}

/// One read of a scenario and what it got.
pub type Read = (ReadSpec, Result<ReadResult, TfError>);

/// What TF's service yields for a read.
#[derive(Debug)]
pub enum Expect {
    /// Exactly this multiset (sorted).
    Multiset(Vec<i64>),
    /// TF's error with this code, its message containing this.
    Error(&'static str, &'static str),
}

pub fn times(epoch: &[i64], n: usize) -> Vec<i64> {
    let mut v: Vec<i64> = epoch
        .iter()
        .flat_map(|&e| std::iter::repeat_n(e, n))
        .collect();
    v.sort_unstable();
    v
}

/// Each read's multiset (or error code), by label: what a coord run must also yield.
pub fn summary(reads: &[Read]) -> Vec<(String, Result<Vec<i64>, String>)> {
    reads
        .iter()
        .map(|(spec, outcome)| {
            let got = match outcome {
                Ok(r) => Ok(r.sorted()),
                Err(e) => Err(e.code.clone()),
            };
            (spec.label(), got)
        })
        .collect()
}

/// The venv's processes, or `None` after printing why the test skips.
pub fn procs_or_skip(test: &str) -> Option<TfDataProcs> {
    match TfDataProcs::get() {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

//! Readers: what a reader process reads ([`ReadSpec`]: a dataset kind, `distribute()`'s
//! arguments), and what it read ([`ReadResult`]), as the events of its thread in a reader
//! process say.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::error::TfError;
use super::proc::ScriptProc;

/// What a reader's dataset is (before `distribute()`); every element is a distinct int64 within
/// one epoch, so multisets of what was read say which elements came how often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatasetKind {
    /// `range(n)` through map, batch and unbatch: 0..n.
    Range(u64),
    /// `from_tensor_slices(0..n)` through map and prefetch: 0..n.
    Slices(u64),
    /// The TFRecord files of [`TfDataProcs::make_files`] in this directory, `list_files` (in name
    /// order) interleaved two at a time, each record decoded, through batch and unbatch.
    Files(PathBuf),
}

impl DatasetKind {
    fn arg(&self) -> String {
        match self {
            DatasetKind::Range(n) => format!("range:{n}"),
            DatasetKind::Slices(n) => format!("slices:{n}"),
            DatasetKind::Files(dir) => format!("files:{}", dir.display()),
        }
    }
}

/// TF's processing modes (`tf.data.experimental.service.ShardingPolicy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Each worker produces the whole dataset (`parallel_epochs`).
    Off,
    /// Splits handed out by the dispatcher (`distributed_epoch`).
    Dynamic,
    /// Static: worker i of the configured list reads files i, i+n, ...
    File,
    /// Static: worker i of n keeps elements i, i+n, ... of the whole dataset.
    Data,
    /// FILE where the source is files, else DATA.
    FileOrData,
    /// `shard(SHARD_HINT, SHARD_HINT)` in the dataset becomes `shard(n, i)`.
    Hint,
}

impl Mode {
    pub const ALL: [Mode; 6] = [
        Mode::Off,
        Mode::Dynamic,
        Mode::File,
        Mode::Data,
        Mode::FileOrData,
        Mode::Hint,
    ];

    /// The script's name of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Dynamic => "dynamic",
            Mode::File => "file",
            Mode::Data => "data",
            Mode::FileOrData => "file_or_data",
            Mode::Hint => "hint",
        }
    }

    /// Whether TF needs the dispatcher's fixed `worker_addresses` list for the mode.
    pub fn is_static(self) -> bool {
        matches!(
            self,
            Mode::File | Mode::Data | Mode::FileOrData | Mode::Hint
        )
    }
}

/// One reader: a dataset, `distribute()`d with these arguments, read with `as_numpy_iterator`.
#[derive(Clone, Debug)]
pub struct ReadSpec {
    pub dataset: DatasetKind,
    pub mode: Mode,
    pub job_name: Option<String>,
    /// Round-robin reads: `num_consumers` and this reader's `consumer_index`.
    pub consumers: Option<(u32, u32)>,
    /// `repeat()` before `distribute()`: `Some(-1)` forever.
    pub repeat: Option<i64>,
    /// Stop after this many elements.
    pub limit: Option<u64>,
    /// Put `shard(SHARD_HINT, SHARD_HINT)` right after the source (for [`Mode::Hint`]).
    pub shard_hint: bool,
    /// A progress event every this many elements (0: none).
    pub progress_every: u64,
    /// Record each element's arrival time ([`ReadResult::walls`]).
    pub timestamps: bool,
    /// Report the first element smaller than one read before ([`Reader::wait_rewind`]).
    pub report_rewind: bool,
}

impl ReadSpec {
    pub fn new(dataset: DatasetKind, mode: Mode) -> ReadSpec {
        ReadSpec {
            dataset,
            mode,
            job_name: None,
            consumers: None,
            repeat: None,
            limit: None,
            shard_hint: false,
            progress_every: 0,
            timestamps: false,
            report_rewind: false,
        }
    }

    /// A short name for messages, e.g. `hint+shard_hint files:many repeat 2` (a directory by its
    /// last component, so that runs on copies of the same files have the same labels).
    pub fn label(&self) -> String {
        let dataset = match &self.dataset {
            DatasetKind::Files(dir) => {
                let name = dir.file_name().unwrap_or(dir.as_os_str());
                format!("files:{}", name.to_string_lossy())
            }
            other => other.arg(),
        };
        let hint = if self.shard_hint { "+shard_hint" } else { "" };
        let mut s = format!("{}{hint} {dataset}", self.mode.as_str());
        if let Some(r) = self.repeat {
            s.push_str(&format!(" repeat {r}"));
        }
        if let Some((n, i)) = self.consumers {
            s.push_str(&format!(" consumer {i}/{n}"));
        }
        s
    }

    pub(super) fn to_json(&self) -> Value {
        json!({
            "dataset": self.dataset.arg(),
            "mode": self.mode.as_str(),
            "job_name": self.job_name,
            "num_consumers": self.consumers.map(|c| c.0),
            "consumer_index": self.consumers.map(|c| c.1),
            "repeat": self.repeat,
            "limit": self.limit,
            "shard_hint": self.shard_hint,
            "progress_every": self.progress_every,
            "timestamps": self.timestamps,
            "report_rewind": self.report_rewind,
        })
    }
}

/// What a reader read.
#[derive(Clone, Debug)]
pub struct ReadResult {
    /// Every element, in the order read.
    pub elements: Vec<i64>,
    /// From the reader's start (before `distribute()`) to its end.
    pub seconds: f64,
    /// From its start to its first element.
    pub first_seconds: Option<f64>,
    /// Each element's arrival (seconds since the epoch), if the spec asked for them.
    pub walls: Vec<f64>,
    /// Ended by [`Reader::stop`], not by the end of its data or its limit.
    pub stopped: bool,
}

impl ReadResult {
    /// The elements in increasing order: the multiset read.
    pub fn sorted(&self) -> Vec<i64> {
        let mut v = self.elements.clone();
        v.sort_unstable();
        v
    }
}

/// The first element smaller than one read before (see [`ReadSpec::report_rewind`]).
#[derive(Clone, Debug)]
pub struct Rewind {
    /// Its position in the reader's elements.
    pub index: usize,
    pub value: i64,
    /// The largest element read before it.
    pub highest: i64,
    /// When it arrived (seconds since the epoch).
    pub wall: f64,
}

/// Reader processes started with [`TfDataProcs::prepare_readers`]: TF imported (or importing),
/// not reading until [`PreparedReaders::go`].
pub struct PreparedReaders {
    pub(super) proc: Arc<ScriptProc>,
    pub(super) specs: Vec<ReadSpec>,
}

impl PreparedReaders {
    /// Starts every reader against `dispatcher`.
    pub fn go(self, dispatcher: &str) -> Vec<Reader> {
        self.proc.send(&format!("go {dispatcher}"));
        self.specs
            .into_iter()
            .enumerate()
            .map(|(index, spec)| Reader {
                index,
                spec,
                proc: self.proc.clone(),
            })
            .collect()
    }
}

/// One reader (a thread of a reader process, which it may share with others).
pub struct Reader {
    index: usize,
    pub spec: ReadSpec,
    proc: Arc<ScriptProc>,
}

impl Reader {
    fn mine<'a>(&self, e: &'a Value, event: &str) -> Option<&'a Value> {
        (e["event"] == event && e["reader"].as_u64() == Some(self.index as u64)).then_some(e)
    }

    fn ended_early(&self, e: &Value) -> bool {
        self.mine(e, "done").is_some() || self.mine(e, "error").is_some()
    }

    /// Waits until it has read `k` elements; panics if it ended before, or at `timeout`.
    pub async fn wait_progress(&self, k: u64, timeout: Duration) {
        let what = format!(
            "progress to {k} of reader {} ({})",
            self.index,
            self.spec.label()
        );
        let ended = self
            .proc
            .wait_for(&what, timeout, |e| {
                if self.mine(e, "progress").and_then(|e| e["read"].as_u64()) >= Some(k) {
                    Some(false)
                } else {
                    self.ended_early(e).then_some(true)
                }
            })
            .await;
        if ended {
            self.proc
                .fail(&format!("reader {} ended before {what}", self.index));
        }
    }

    /// Waits for its first element smaller than one before (the spec must ask for it).
    pub async fn wait_rewind(&self, timeout: Duration) -> Rewind {
        let what = format!("rewind of reader {} ({})", self.index, self.spec.label());
        let rewind = self
            .proc
            .wait_for(&what, timeout, |e| {
                if let Some(e) = self.mine(e, "rewind") {
                    Some(Some(Rewind {
                        index: e["index"].as_u64().unwrap_or(0) as usize,
                        value: e["value"].as_i64().unwrap_or(0),
                        highest: e["highest"].as_i64().unwrap_or(0),
                        wall: e["wall"].as_f64().unwrap_or(0.0),
                    }))
                } else {
                    self.ended_early(e).then_some(None)
                }
            })
            .await;
        rewind.unwrap_or_else(|| {
            self.proc
                .fail(&format!("reader {} ended before the {what}", self.index))
        })
    }

    /// Ends the reader where it is; its result then has `stopped`.
    pub fn stop(&self) {
        self.proc.send(&format!("stop {}", self.index));
    }

    /// What it read, or TF's error; panics if neither came within `timeout`.
    pub async fn finish(&self, timeout: Duration) -> Result<ReadResult, TfError> {
        match self.outcome(timeout).await {
            Some(r) => r,
            None => self.proc.fail(&format!(
                "reader {} ({}) did not finish within {timeout:?}",
                self.index,
                self.spec.label()
            )),
        }
    }

    /// As [`Reader::finish`], but `None` if it was still reading at `timeout` (TF hangs on some
    /// input: that is an outcome too).
    pub async fn outcome(&self, timeout: Duration) -> Option<Result<ReadResult, TfError>> {
        let r = self
            .proc
            .try_wait_for(timeout, |e| {
                if let Some(e) = self.mine(e, "done") {
                    Some(Ok(read_result(e)))
                } else {
                    self.mine(e, "error").map(|e| Err(TfError::from_event(e)))
                }
            })
            .await;
        match r {
            Ok(outcome) => Some(outcome),
            Err(why) if self.proc.ended.load(Ordering::SeqCst) => {
                self.proc.fail(&format!("reader {}: {why}", self.index))
            }
            Err(_) => None,
        }
    }
}

pub(super) fn read_result(e: &Value) -> ReadResult {
    let numbers = |key: &str| -> Vec<Value> { e[key].as_array().cloned().unwrap_or_default() };
    ReadResult {
        elements: numbers("elements")
            .iter()
            .filter_map(Value::as_i64)
            .collect(),
        seconds: e["seconds"].as_f64().unwrap_or(0.0),
        first_seconds: e["first_seconds"].as_f64(),
        walls: numbers("walls").iter().filter_map(Value::as_f64).collect(),
        stopped: e["stopped"].as_bool().unwrap_or(false),
    }
}

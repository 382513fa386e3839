//! Group commit: the one thread that makes log writes durable.
//!
//! sled 0.34's `flush()` ends in `sync_file_range`, which survives a process crash but not a power
//! loss (spacejam/sled#1452). So after sled's flush the flusher also `fdatasync`s sled's log file,
//! and any blob file sled wrote beside it (sled writes large values into `blobs/` without syncing
//! them). Only then are the writers told their data is on disk.
//!
//! Writers enqueue a job and go on; the thread takes every job queued so far, syncs once and
//! completes them all in FIFO order. Many appends thus share one sync, and because a sync covers
//! every write made before it started, completion order equals submission order.
//!
//! Blob files cost a directory scan to find, so the flusher looks for them only once an entry big
//! enough to put a page over sled's blob threshold has been written ([`BLOB_SUSPECT_ENTRY_BYTES`]),
//! and from then on at every sync; blobs left by an earlier run are synced at start.
//!
//! After a failed sync the flusher fails every later job as well: once `fsync` has reported an
//! error, the kernel may have dropped the dirty pages, and a later "successful" sync would lie.

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use openraft::storage::LogFlushed;
use tokio::sync::oneshot;

use crate::stats::SyncStats;
use crate::types::TypeConfig;

use super::witness::Witness;

/// sled's segment size for the Raft log.
pub const SEGMENT_SIZE: usize = 8 << 20;
/// sled writes a page larger than this to its own blob file.
const BLOB_THRESHOLD: usize = SEGMENT_SIZE / 4;
/// A sled leaf holds up to 17 items before it splits, so once an entry this large exists a page
/// may cross [`BLOB_THRESHOLD`].
pub const BLOB_SUSPECT_ENTRY_BYTES: usize = BLOB_THRESHOLD / 17;

/// How far the log has got, as the flusher needs to know it to advance the witness.
#[derive(Default)]
pub(crate) struct LogPositions {
    /// Set (for good) once an entry of [`BLOB_SUSPECT_ENTRY_BYTES`] or more was written.
    pub blobs_possible: std::sync::atomic::AtomicBool,
    /// Index of the last appended entry (0 when the log is empty).
    pub appended: std::sync::atomic::AtomicU64,
    /// The committed index openraft last reported.
    pub committed: std::sync::atomic::AtomicU64,
}

/// A hook into every sync, for tests and fault injection. It runs on the flusher thread right
/// before the files are synced: blocking in it holds back every writer waiting on that sync, and
/// an error from it is reported to them as a failed sync.
pub trait SyncHook: Send + Sync + 'static {
    fn before_sync(&self) -> io::Result<()>;
}

enum Job {
    /// Entries were appended; tell openraft once they are durable.
    Append(LogFlushed<TypeConfig>),
    /// Someone (a vote save, a truncate) waits until everything written so far is durable.
    Wait(oneshot::Sender<io::Result<()>>),
}

impl Job {
    fn complete(self, result: &Result<(), String>) {
        let r = result
            .as_ref()
            .map(|_| ())
            .map_err(|e| io::Error::other(e.clone()));
        match self {
            Job::Append(cb) => cb.log_io_completed(r),
            // The waiter may have gone away; nothing to tell then.
            Job::Wait(tx) => drop(tx.send(r)),
        }
    }
}

/// Owns the flusher thread; dropping it lets the thread finish the queued jobs and exit.
pub(crate) struct Flusher {
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<SyncStats>,
}

impl Flusher {
    pub(crate) fn start(target: SyncTarget) -> io::Result<Self> {
        let stats = Arc::new(SyncStats::default());
        let (tx, rx) = mpsc::channel();
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("coord-log-flusher".into())
            .spawn(move || run(rx, target, &thread_stats))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            stats,
        })
    }

    pub(crate) fn stats(&self) -> &Arc<SyncStats> {
        &self.stats
    }

    /// Queues an append's completion callback; it fires after the next sync.
    pub(crate) fn after_sync(&self, cb: LogFlushed<TypeConfig>) -> io::Result<()> {
        self.send(Job::Append(cb))
    }

    /// Returns once everything written before the call is durable.
    pub(crate) async fn sync(&self) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Wait(tx))?;
        rx.await
            .map_err(|_| io::Error::other("log flusher stopped before syncing"))?
    }

    fn send(&self, job: Job) -> io::Result<()> {
        self.stats
            .submitted
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(job).ok())
            .ok_or_else(|| io::Error::other("log flusher has stopped"))
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(rx: mpsc::Receiver<Job>, mut target: SyncTarget, stats: &SyncStats) {
    let mut failed: Option<String> = None;
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let result = match &failed {
            Some(e) => Err(format!("an earlier sync failed: {e}")),
            None => {
                let started = Instant::now();
                let r = target.sync().map_err(|e| e.to_string());
                stats.latency.record(started.elapsed());
                stats
                    .syncs
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if let Err(e) = &r {
                    tracing::error!(error = %e, "log sync failed; refusing all further writes");
                    failed = Some(e.clone());
                }
                r
            }
        };
        stats
            .jobs
            .fetch_add(jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
        for job in jobs {
            job.complete(&result);
        }
    }
}

/// The files a sync must reach, and what to tell the witness after.
pub(crate) struct SyncTarget {
    db: sled::Db,
    /// sled's single log file, opened once.
    log_file: File,
    blob_dir: PathBuf,
    /// Blob files already synced (sled never rewrites a blob in place).
    synced_blobs: HashSet<std::ffi::OsString>,
    hook: Option<Arc<dyn SyncHook>>,
    witness: Arc<Witness>,
    positions: Arc<LogPositions>,
}

impl SyncTarget {
    pub(crate) fn open(
        db: sled::Db,
        dir: &Path,
        hook: Option<Arc<dyn SyncHook>>,
        witness: Arc<Witness>,
        positions: Arc<LogPositions>,
    ) -> io::Result<Self> {
        let log_file = File::open(dir.join("db"))?;
        let mut target = Self {
            db,
            log_file,
            blob_dir: dir.join("blobs"),
            synced_blobs: HashSet::new(),
            hook,
            witness,
            positions,
        };
        // Blobs of an earlier run may never have been synced (a crash after sled wrote them).
        target.sync_new_blobs()?;
        Ok(target)
    }

    fn sync(&mut self) -> io::Result<()> {
        use std::sync::atomic::Ordering::Acquire;
        if let Some(hook) = &self.hook {
            hook.before_sync()?;
        }
        // Whatever was appended before this sync starts is durable once it ends.
        let appended = self.positions.appended.load(Acquire);
        self.db.flush().map_err(io::Error::other)?;
        self.log_file.sync_data()?;
        if self.positions.blobs_possible.load(Acquire) {
            self.sync_new_blobs()?;
        }
        let committed = self.positions.committed.load(Acquire);
        self.witness.advance_committed(committed.min(appended))
    }

    fn sync_new_blobs(&mut self) -> io::Result<()> {
        let entries = match std::fs::read_dir(&self.blob_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut present = HashSet::new();
        let mut new = false;
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            if !self.synced_blobs.contains(&name) {
                match File::open(entry.path()) {
                    Ok(f) => f.sync_data()?,
                    // sled may have garbage-collected it meanwhile.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e),
                }
                new = true;
            }
            present.insert(name);
        }
        if new {
            File::open(&self.blob_dir)?.sync_all()?;
        }
        self.synced_blobs = present;
        Ok(())
    }
}

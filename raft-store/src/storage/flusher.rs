//! Group commit: the one thread that makes log writes durable.
//!
//! Writers write to the log's engine (see `engine`: the segment files, or sled); then they enqueue
//! a job and go on. The thread takes every job queued so far, has the engine sync everything
//! written since the last sync once (`fdatasync` of the segments written; sled's flush and an
//! `fdatasync` of its files), and completes the jobs in FIFO order. Many appends thus share one
//! sync, and because a sync covers every write made before it started, completion order equals
//! submission order.
//!
//! After a failed sync the flusher fails every later job as well: once `fsync` has reported an
//! error, the kernel may have dropped the dirty pages, and a later "successful" sync would lie.
//!
//! A lone write (nothing queued, nothing being synced) may instead be synced on the writer's own
//! thread ([`Flusher::sync_here`]): the writer (openraft's core) waits for the sync either way,
//! and this saves the two thread hand-offs, to the flusher and back, that a lone write otherwise
//! pays for on every replica. The files are synced under one lock, so the two paths never
//! overlap and completion order still equals submission order.

use std::io;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Instant;

use openraft::storage::LogFlushed;
use tokio::sync::oneshot;

use crate::stats::SyncStats;
use crate::types::TypeConfig;

use super::engine::LogSync;
use super::witness::Witness;

/// How far the log has got, as the flusher needs to know it to advance the witness.
#[derive(Default)]
pub(crate) struct LogPositions {
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
    shared: Arc<Shared>,
}

/// What the flusher thread and a writer syncing on its own thread share.
struct Shared {
    target: Mutex<Syncer>,
    /// Jobs handed to the thread and not completed yet.
    pending: AtomicU64,
}

/// The files to sync, and whether a sync ever failed.
struct Syncer {
    target: SyncTarget,
    failed: Option<String>,
}

impl Syncer {
    fn sync(&mut self, stats: &SyncStats) -> Result<(), String> {
        if let Some(e) = &self.failed {
            return Err(format!("an earlier sync failed: {e}"));
        }
        let started = Instant::now();
        let r = self.target.sync().map_err(|e| e.to_string());
        stats.latency.record(started.elapsed());
        stats.syncs.fetch_add(1, Relaxed);
        if let Err(e) = &r {
            tracing::error!(error = %e, "log sync failed; refusing all further writes");
            self.failed = Some(e.clone());
        }
        r
    }
}

impl Flusher {
    pub(crate) fn start(target: SyncTarget) -> io::Result<Self> {
        let stats = Arc::new(SyncStats::default());
        let shared = Arc::new(Shared {
            target: Mutex::new(Syncer {
                target,
                failed: None,
            }),
            pending: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let (thread_stats, thread_shared) = (stats.clone(), shared.clone());
        let thread = std::thread::Builder::new()
            .name("coord-log-flusher".into())
            .spawn(move || run(rx, &thread_shared, &thread_stats))?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            stats,
            shared,
        })
    }

    /// Syncs now, on the caller's thread, and completes `cb`, if nothing is queued or being
    /// synced; otherwise queues `cb` like [`Self::after_sync`]. Blocks the caller for the sync.
    pub(crate) fn sync_here(&self, cb: LogFlushed<TypeConfig>) -> io::Result<()> {
        if self.shared.pending.load(Acquire) == 0 {
            if let Ok(mut syncer) = self.shared.target.try_lock() {
                self.stats.submitted.fetch_add(1, Relaxed);
                let result = syncer.sync(&self.stats);
                drop(syncer);
                self.stats.jobs.fetch_add(1, Relaxed);
                Job::Append(cb).complete(&result);
                return Ok(());
            }
        }
        self.after_sync(cb)
    }

    pub(crate) fn stats(&self) -> &Arc<SyncStats> {
        &self.stats
    }

    /// Queues an append's completion callback; it fires after the next sync.
    pub(crate) fn after_sync(&self, cb: LogFlushed<TypeConfig>) -> io::Result<()> {
        self.send(Job::Append(cb))
    }

    /// [`Self::sync`], but on the caller's thread when nothing is queued or being synced (see
    /// [`Self::sync_here`]).
    pub(crate) async fn sync_now(&self) -> io::Result<()> {
        if self.shared.pending.load(Acquire) == 0 {
            if let Ok(mut syncer) = self.shared.target.try_lock() {
                let result = syncer.sync(&self.stats);
                return result.map_err(io::Error::other);
            }
        }
        self.sync().await
    }

    /// Returns once everything written before the call is durable.
    pub(crate) async fn sync(&self) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Wait(tx))?;
        rx.await
            .map_err(|_| io::Error::other("log flusher stopped before syncing"))?
    }

    fn send(&self, job: Job) -> io::Result<()> {
        self.stats.submitted.fetch_add(1, Relaxed);
        // Counted before it is sent, so that `sync_here` never sees an idle flusher that has a
        // job on its way.
        self.shared.pending.fetch_add(1, AcqRel);
        let sent = self.tx.as_ref().and_then(|tx| tx.send(job).ok());
        if sent.is_none() {
            self.shared.pending.fetch_sub(1, AcqRel);
        }
        sent.ok_or_else(|| io::Error::other("log flusher has stopped"))
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

fn run(rx: mpsc::Receiver<Job>, shared: &Shared, stats: &SyncStats) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        let result = shared
            .target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sync(stats);
        stats.jobs.fetch_add(jobs.len() as u64, Relaxed);
        let n = jobs.len() as u64;
        for job in jobs {
            job.complete(&result);
        }
        shared.pending.fetch_sub(n, AcqRel);
    }
}

/// What a sync must reach (the engine's files), and what to tell the witness after.
pub(crate) struct SyncTarget {
    files: Box<dyn LogSync>,
    hook: Option<Arc<dyn SyncHook>>,
    witness: Arc<Witness>,
    positions: Arc<LogPositions>,
}

impl SyncTarget {
    pub(crate) fn new(
        files: Box<dyn LogSync>,
        hook: Option<Arc<dyn SyncHook>>,
        witness: Arc<Witness>,
        positions: Arc<LogPositions>,
    ) -> Self {
        Self {
            files,
            hook,
            witness,
            positions,
        }
    }

    fn sync(&mut self) -> io::Result<()> {
        if let Some(hook) = &self.hook {
            hook.before_sync()?;
        }
        // Whatever was appended before this load is written (writers write before they publish
        // the position), so it is durable once the engine's sync ends.
        let appended = self.positions.appended.load(Acquire);
        self.files.sync()?;
        let committed = self.positions.committed.load(Acquire);
        self.witness.advance_committed(committed.min(appended))
    }
}

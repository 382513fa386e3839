//! The Raft log and vote: openraft's [`RaftLogStorage`], implemented here and nowhere else, over
//! a `LogEngine` (the segment files of [`super::wal`], or sled: see [`super::engine`]).
//!
//! Durability: `append` writes the entries (so they are readable when it returns) and hands the
//! completion callback to the [`Flusher`], which calls it only after `fdatasync`. `save_vote`,
//! `truncate` and `purge` wait for a sync before returning. An engine's writes are made one at a
//! time and a sync covers every write made before it, so writes reach disk in submission order.
//!
//! A leader's lone write also goes to followers before it is synced ([`super::pre_append`]); a
//! follower's log may therefore hold entries its Raft core has not been told of yet, and `append`
//! neither writes those again nor keeps them when different ones come at their indexes.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::codec;
use crate::stats::SyncStats;
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader, StorageIOError};

use super::engine::LogEngine;
use super::flusher::{Flusher, LogPositions};
use super::pre_append::{PreAppend, PreAppendSink, MAX_PRE_APPEND_BYTES};
use super::witness::Witness;

/// Replication reads at most this many bytes of entries for one AppendEntries (but always at least
/// one entry), so a burst of large values cannot build a gigantic message.
const REPLICATION_BATCH_BYTES: usize = 8 << 20;

/// The Raft log. Cloning is cheap; clones share the engine and the flusher.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where the log is kept: one dynamic call a write or read, nothing else, on either engine.
    log: Box<dyn LogEngine>,
    flusher: Flusher,
    witness: Arc<Witness>,
    positions: Arc<LogPositions>,
    /// This replica's id and where its lone writes go while it syncs them, if anywhere (see
    /// [`super::pre_append`]).
    pre_append: std::sync::OnceLock<(u64, Arc<dyn PreAppendSink>)>,
}

/// An error of kind `make` (write_vote, write_logs, …) caused by `e`.
fn storage_err<E: std::error::Error + 'static>(
    make: fn(openraft::AnyError) -> StorageIOError<u64>,
    e: E,
) -> StorageError {
    make(openraft::AnyError::new(&e)).into()
}

/// A read error at one index, as openraft wants it.
fn read_err((index, why): (u64, String)) -> StorageError {
    StorageIOError::read_log_at_index(index, openraft::AnyError::error(why)).into()
}

impl LogStore {
    pub(crate) fn new(
        log: Box<dyn LogEngine>,
        flusher: Flusher,
        witness: Arc<Witness>,
        positions: Arc<LogPositions>,
    ) -> Self {
        let last = log.bounds().1.map_or(0, |l| l.index);
        positions.appended.store(last, Ordering::Release);
        Self {
            inner: Arc::new(Inner {
                log,
                flusher,
                witness,
                positions,
                pre_append: std::sync::OnceLock::new(),
            }),
        }
    }

    /// From now on, when replica `me` leads, each of its lone writes goes to `sink` right after
    /// it is written, before it is synced (see [`super::pre_append`]). Set once.
    pub fn send_lone_writes_ahead(&self, me: u64, sink: Arc<dyn PreAppendSink>) {
        let _ = self.inner.pre_append.set((me, sink));
    }

    /// A follower's side of [`super::pre_append`]: writes `msg`'s entries if they extend this
    /// log exactly as an AppendEntries of the leader this replica follows would, and returns
    /// once they are durable. Returns whether they were written; entries that do not decode to
    /// their log ids are refused.
    pub async fn pre_append(&self, msg: PreAppend) -> Result<bool, String> {
        let first = msg.prev.map_or(0, |p| p.index + 1);
        for (i, (id, bytes)) in msg.entries.iter().enumerate() {
            let entry: Entry = codec::decode("log entry", bytes).map_err(|e| e.to_string())?;
            if entry.log_id != *id || id.index != first + i as u64 {
                return Err(format!(
                    "entry {i} of a pre-append is {} where {id} at index {} was announced",
                    entry.log_id,
                    first + i as u64
                ));
            }
        }
        let Some((last, _)) = msg.entries.last() else {
            return Ok(false);
        };
        let written = self
            .inner
            .log
            .append_if(&msg.vote, msg.prev, &msg.entries)
            .map_err(|e| e.to_string())?;
        let stats = self.inner.flusher.stats();
        if !written {
            stats.pre_appends_passed.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        stats.pre_appends_written.fetch_add(1, Ordering::Relaxed);
        self.inner
            .positions
            .appended
            .store(last.index, Ordering::Release);
        self.inner
            .flusher
            .sync_now()
            .await
            .map_err(|e| e.to_string())?;
        Ok(true)
    }

    /// Writes the initial (empty) witness of a new log.
    pub(crate) fn init_witness(&self) -> std::io::Result<()> {
        self.inner.witness.write_initial()
    }

    /// How the flusher has performed (syncs, writes per sync, latency).
    pub fn sync_stats(&self) -> Arc<SyncStats> {
        self.inner.flusher.stats().clone()
    }

    /// (last purged, last) log ids; `last` falls back to the purge point when the log is empty.
    pub(crate) fn log_bounds(&self) -> (Option<LogId>, Option<LogId>) {
        self.inner.log.bounds()
    }

    /// The id of the last entry in the log (written, synced or not): what a vote compares.
    pub fn last_log_id(&self) -> Option<LogId> {
        self.inner.log.bounds().1
    }

    pub(crate) fn stored_vote(&self) -> Option<Vote> {
        self.inner.log.vote()
    }
}

impl LogStore {
    /// The pre-append of `entries`, just written, and where it goes: only when this replica
    /// leads and wrote them as leader.
    fn ahead(&self, entries: &[(LogId, Vec<u8>)]) -> Option<(PreAppend, Arc<dyn PreAppendSink>)> {
        let (me, sink) = self.inner.pre_append.get()?;
        let vote = self.stored_vote()?;
        let ((first, _), (last, _)) = (entries.first()?, entries.last()?);
        let prev = self.inner.log.id_before(first.index);
        let bytes: usize = entries.iter().map(|(_, b)| b.len()).sum();
        let leads = bytes <= MAX_PRE_APPEND_BYTES
            && vote.is_committed()
            && vote.leader_id().voted_for() == Some(*me)
            && last.leader_id.node_id == *me;
        leads.then(|| {
            (
                PreAppend {
                    vote,
                    prev,
                    entries: entries.to_vec(),
                },
                sink.clone(),
            )
        })
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        self.inner.log.read(range, None).map_err(read_err)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        self.inner
            .log
            .read(
                (Bound::Included(start), Bound::Excluded(end)),
                Some(REPLICATION_BATCH_BYTES),
            )
            .map_err(read_err)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let (last_purged_log_id, last_log_id) = self.log_bounds();
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let err = |e| storage_err(StorageIOError::write_vote, e);
        self.inner.log.save_vote(vote).map_err(err)?;
        self.inner.flusher.sync().await.map_err(err)?;
        let (witness, vote) = (self.inner.witness.clone(), *vote);
        tokio::task::spawn_blocking(move || witness.record_vote(&vote))
            .await
            .map_err(|e| storage_err(StorageIOError::write_vote, e))?
            .map_err(err)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.stored_vote())
    }

    /// The committed id is a hint for replay after a restart; it rides on the next write and sync
    /// and need not be durable on its own (a stale value only means the leader re-sends the commit
    /// index). A commit thus costs the leader no system call before it applies.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(c) = committed {
            self.inner
                .positions
                .committed
                .fetch_max(c.index, Ordering::AcqRel);
        }
        self.inner
            .log
            .save_committed(committed)
            .map_err(|e| storage_err(StorageIOError::write, e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.inner.log.committed())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let err = |e| storage_err(StorageIOError::write_logs, e);
        let encoded = entries
            .into_iter()
            .map(|entry| Ok((entry.log_id, codec::encode("log entry", &entry)?)))
            .collect::<Result<Vec<_>, codec::CodecError>>()
            .map_err(|e| storage_err(StorageIOError::write_logs, e))?;
        let written = self.inner.log.append(&encoded).map_err(err)?;
        let positions = &self.inner.positions;
        let mut lone = false;
        if let Some((last, _)) = encoded.last() {
            // After the write marked its file unsynced: see the flusher's `sync`.
            let before = positions.appended.swap(last.index, Ordering::AcqRel);
            // Everything before these entries is committed: they are all there is to replicate
            // and commit, nothing else is waiting for this replica's Raft thread, and the sync
            // may as well run on it (see `Flusher::sync_here`).
            lone = positions.committed.load(Ordering::Acquire) >= before;
        }
        if lone {
            if let Some(ahead) = self.ahead(&encoded).filter(|_| written == encoded.len()) {
                // This replica's sync starts on the flusher thread while this one sends the
                // entries: the syncs overlap.
                let queued = self.inner.flusher.after_sync(callback).map_err(err);
                let sent = ahead.1.send(ahead.0);
                self.inner
                    .flusher
                    .stats()
                    .pre_appends_sent
                    .fetch_add(sent as u64, Ordering::Relaxed);
                return queued;
            }
            self.inner.flusher.sync_here(callback).map_err(err)
        } else if written == 0 {
            // A pre-append wrote them already, and its sync has them or is under way: nothing
            // to wait for but that.
            self.inner.flusher.sync_here(callback).map_err(err)
        } else {
            self.inner.flusher.after_sync(callback).map_err(err)
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let err = |e| storage_err(StorageIOError::write_logs, e);
        self.inner
            .positions
            .appended
            .store(log_id.index.saturating_sub(1), Ordering::Release);
        self.inner.log.truncate(log_id.index).map_err(err)?;
        self.inner.flusher.sync().await.map_err(err)
    }

    /// Records the new purge point, waits until it is durable, and only then gives back the space
    /// (the segments it made useless): a crash in between leaves only unreachable entries behind,
    /// never a hole and never a purge point that went backwards.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let err = |e| storage_err(StorageIOError::write_logs, e);
        self.inner.log.purge(log_id).map_err(err)?;
        self.inner.flusher.sync().await.map_err(err)?;
        self.inner.log.reclaim_purged().map_err(err)?;
        Ok(())
    }
}

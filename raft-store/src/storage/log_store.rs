//! The Raft log and vote in sled: openraft's [`RaftLogStorage`], implemented here and nowhere else.
//!
//! Layout: tree `logs` maps the big-endian index to the encoded entry, tree `meta` holds the vote,
//! the committed and last purged log ids, and the replica's identity.
//!
//! Durability: `append` writes the entries synchronously (so they are readable when it returns)
//! and hands the completion callback to the [`Flusher`], which calls it only after `fdatasync`.
//! `save_vote` and `truncate` wait for a sync before returning. All writes go through one sled
//! database, and a sync covers every write made before it, so writes reach disk in submission
//! order.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use crate::codec;
use crate::stats::SyncStats;
use crate::types::{Entry, LogId, StorageError, TypeConfig, Vote};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogReader, StorageIOError};

use super::flusher::{Flusher, LogPositions, BLOB_SUSPECT_ENTRY_BYTES};
use super::witness::Witness;

const KEY_VOTE: &[u8] = b"vote";
const KEY_COMMITTED: &[u8] = b"committed";
const KEY_LAST_PURGED: &[u8] = b"last_purged";

/// Replication reads at most this many bytes of entries for one AppendEntries (but always at least
/// one entry), so a burst of large values cannot build a gigantic message.
const REPLICATION_BATCH_BYTES: usize = 8 << 20;

/// The sled-backed Raft log. Cloning is cheap; clones share one database and one flusher.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Inner>,
}

struct Inner {
    logs: sled::Tree,
    meta: sled::Tree,
    flusher: Flusher,
    witness: Arc<Witness>,
    positions: Arc<LogPositions>,
}

fn io_err<E: std::error::Error + 'static>(
    make: fn(openraft::AnyError) -> StorageIOError<u64>,
) -> impl Fn(E) -> StorageError {
    move |e| make(openraft::AnyError::new(&e)).into()
}

impl LogStore {
    pub(crate) fn new(
        db: &sled::Db,
        flusher: Flusher,
        witness: Arc<Witness>,
        positions: Arc<LogPositions>,
    ) -> Result<Self, StorageError> {
        let tree = |name: &str| db.open_tree(name).map_err(io_err(StorageIOError::read));
        let store = Self {
            inner: Arc::new(Inner {
                logs: tree("logs")?,
                meta: tree("meta")?,
                flusher,
                witness,
                positions,
            }),
        };
        let last = store.log_bounds()?.1.map_or(0, |l| l.index);
        store
            .inner
            .positions
            .appended
            .store(last, std::sync::atomic::Ordering::Release);
        Ok(store)
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
    pub(crate) fn log_bounds(&self) -> Result<(Option<LogId>, Option<LogId>), StorageError> {
        let last_purged = self.read_log_id(KEY_LAST_PURGED)?;
        let last = match self
            .inner
            .logs
            .last()
            .map_err(io_err(StorageIOError::read_logs))?
        {
            Some((k, v)) => Some(Self::decode_entry(&k, &v)?.log_id),
            None => None,
        };
        Ok((last_purged, last.or(last_purged)))
    }

    pub(crate) fn stored_vote(&self) -> Result<Option<Vote>, StorageError> {
        self.read_meta_value(KEY_VOTE, "vote", StorageIOError::read_vote)
    }

    fn read_log_id(&self, key: &[u8]) -> Result<Option<LogId>, StorageError> {
        self.read_meta_value(key, "log id", StorageIOError::read)
    }

    /// Reads and decodes one value of the `meta` tree; `err` says what failed to read.
    fn read_meta_value<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        what: &'static str,
        err: fn(openraft::AnyError) -> StorageIOError<u64>,
    ) -> Result<Option<T>, StorageError> {
        let Some(bytes) = self.inner.meta.get(key).map_err(io_err(err))? else {
            return Ok(None);
        };
        codec::decode(what, &bytes).map(Some).map_err(io_err(err))
    }

    fn decode_entry(index: &[u8], bytes: &[u8]) -> Result<Entry, StorageError> {
        codec::decode::<Entry>("log entry", bytes).map_err(|e| {
            let at = index.try_into().map(u64::from_be_bytes).unwrap_or_default();
            StorageIOError::read_log_at_index(at, openraft::AnyError::new(&e)).into()
        })
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn to_key_range<RB: RangeBounds<u64>>(range: &RB) -> (Bound<[u8; 8]>, Bound<[u8; 8]>) {
    let map = |b: Bound<&u64>| match b {
        Bound::Included(i) => Bound::Included(index_key(*i)),
        Bound::Excluded(i) => Bound::Excluded(index_key(*i)),
        Bound::Unbounded => Bound::Unbounded,
    };
    (map(range.start_bound()), map(range.end_bound()))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut out = Vec::new();
        for item in self.inner.logs.range(to_key_range(&range)) {
            let (k, v) = item.map_err(io_err(StorageIOError::read_logs))?;
            out.push(Self::decode_entry(&k, &v)?);
        }
        Ok(out)
    }

    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for item in self.inner.logs.range(index_key(start)..index_key(end)) {
            let (k, v) = item.map_err(io_err(StorageIOError::read_logs))?;
            if !out.is_empty() && bytes + v.len() > REPLICATION_BATCH_BYTES {
                break;
            }
            bytes += v.len();
            out.push(Self::decode_entry(&k, &v)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let (last_purged_log_id, last_log_id) = self.log_bounds()?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let bytes = codec::encode("vote", vote).map_err(io_err(StorageIOError::write_vote))?;
        self.inner
            .meta
            .insert(KEY_VOTE, bytes)
            .map_err(io_err(StorageIOError::write_vote))?;
        self.inner
            .flusher
            .sync()
            .await
            .map_err(io_err(StorageIOError::write_vote))?;
        let (witness, vote) = (self.inner.witness.clone(), *vote);
        tokio::task::spawn_blocking(move || witness.record_vote(&vote))
            .await
            .map_err(io_err(StorageIOError::write_vote))?
            .map_err(io_err(StorageIOError::write_vote))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.stored_vote()
    }

    /// The committed id is a hint for replay after a restart; it rides on the next sync and need
    /// not be durable on its own (a stale value only means the leader re-sends the commit index).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        if let Some(c) = committed {
            self.inner
                .positions
                .committed
                .fetch_max(c.index, std::sync::atomic::Ordering::AcqRel);
        }
        let bytes = codec::encode("log id", &committed).map_err(io_err(StorageIOError::write))?;
        self.inner
            .meta
            .insert(KEY_COMMITTED, bytes)
            .map_err(io_err(StorageIOError::write))?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let committed: Option<Option<LogId>> =
            self.read_meta_value(KEY_COMMITTED, "log id", StorageIOError::read)?;
        Ok(committed.flatten())
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
        let mut batch = sled::Batch::default();
        let mut last = None;
        let mut largest = 0;
        for entry in entries {
            let bytes =
                codec::encode("log entry", &entry).map_err(io_err(StorageIOError::write_logs))?;
            largest = largest.max(bytes.len());
            batch.insert(&index_key(entry.log_id.index), bytes);
            last = Some(entry.log_id.index);
        }
        if largest >= BLOB_SUSPECT_ENTRY_BYTES {
            // Set before the write: the sync that covers it must look for blob files.
            self.inner
                .positions
                .blobs_possible
                .store(true, std::sync::atomic::Ordering::Release);
        }
        self.inner
            .logs
            .apply_batch(batch)
            .map_err(io_err(StorageIOError::write_logs))?;
        if let Some(last) = last {
            self.inner
                .positions
                .appended
                .store(last, std::sync::atomic::Ordering::Release);
        }
        self.inner
            .flusher
            .after_sync(callback)
            .map_err(io_err(StorageIOError::write_logs))
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.inner.positions.appended.store(
            log_id.index.saturating_sub(1),
            std::sync::atomic::Ordering::Release,
        );
        let mut batch = sled::Batch::default();
        for item in self.inner.logs.range(index_key(log_id.index)..) {
            let (k, _) = item.map_err(io_err(StorageIOError::write_logs))?;
            batch.remove(k);
        }
        self.inner
            .logs
            .apply_batch(batch)
            .map_err(io_err(StorageIOError::write_logs))?;
        self.inner
            .flusher
            .sync()
            .await
            .map_err(io_err(StorageIOError::write_logs))
    }

    /// Records the new purge point first and deletes afterwards: a crash in between leaves only
    /// unreachable entries behind, never a hole and never a purge point that went backwards.
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let bytes = codec::encode("log id", &log_id).map_err(io_err(StorageIOError::write_logs))?;
        self.inner
            .meta
            .insert(KEY_LAST_PURGED, bytes)
            .map_err(io_err(StorageIOError::write_logs))?;
        let mut batch = sled::Batch::default();
        for item in self.inner.logs.range(..=index_key(log_id.index)) {
            let (k, _) = item.map_err(io_err(StorageIOError::write_logs))?;
            batch.remove(k);
        }
        self.inner
            .logs
            .apply_batch(batch)
            .map_err(io_err(StorageIOError::write_logs))
    }
}

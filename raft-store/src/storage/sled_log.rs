//! The Raft log in a sled 0.34 database (`--raft-log sled`), in `raft/sled/`.
//!
//! One tree holds everything, so that every write is one atomic `apply_batch`: an entry under
//! `e` + its index (big-endian, so the keys sort as the log), its value the entry's log id in
//! fixed form (as in a segment's entry record) and then the encoded entry; the vote, the
//! committed id and the purge point under `m/…`. A purge records its point and deletes the
//! entries up to it in the same batch, and an append that replaces entries deletes the old ones
//! in the batch that writes the new, so a crash leaves no hole and no purge point that went
//! backwards. The vote, the committed id, the purge point and the last log id are also kept in
//! memory, under the lock every write takes (which also makes a pre-append's check and its write
//! one step, as in [`super::wal`]).
//!
//! Durability is [`SledSync`]'s: sled's `flush` ends in `sync_file_range`, which survives a
//! crash of the process but not of the machine (spacejam/sled#1452), so each sync also
//! `fdatasync`s sled's log file and the blob files sled wrote since the last one (a tree node
//! over about 128 KiB, such as one holding a large value, goes to a file of its own in `blobs/`,
//! written without a sync), and the directories whose entries changed. sled's periodic flush is
//! off: the flusher's group commit is the only one.
//!
//! At open every entry is read back and checked (its key, its log id, its decoding, and that the
//! entries follow one another from the purge point on): sled reads a page only when it is asked
//! for it, and damage found on a later read would stop a running replica instead of refusing to
//! start it. sled 0.34 panics on some damaged files; the open turns that into a refusal. A log
//! cut short that sled opens cleanly is caught by the witness, as a lost segment is.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::codec;
use crate::types::{Entry, LogId, Vote};

use super::engine::{LogEngine, LogSync};
use super::segments::{entry_log_id, ENTRY_HEAD};

/// sled's page cache. The log is append-mostly and read back soon after it is written; sled's
/// 1 GiB default is far more than a coordinator needs.
const CACHE_BYTES: u64 = 64 << 20;

/// sled's directory of values too large for its log file.
const BLOBS: &str = "blobs";

const ENTRY: u8 = b'e';
const KEY_VOTE: &[u8] = b"m/vote";
const KEY_COMMITTED: &[u8] = b"m/committed";
const KEY_PURGED: &[u8] = b"m/purged";

fn entry_key(index: u64) -> [u8; 9] {
    let mut key = [ENTRY; 9];
    key[1..].copy_from_slice(&index.to_be_bytes());
    key
}

fn key_index(key: &[u8]) -> Option<u64> {
    match key {
        [ENTRY, rest @ ..] => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

/// Every entry key.
fn all_entries() -> (Bound<[u8; 9]>, Bound<[u8; 9]>) {
    (
        Bound::Included(entry_key(0)),
        Bound::Included(entry_key(u64::MAX)),
    )
}

/// What the log holds besides its entries, and where its entries end.
#[derive(Default)]
struct State {
    vote: Option<Vote>,
    committed: Option<LogId>,
    /// `committed` changed since it was last written: the next write carries it.
    committed_unwritten: bool,
    purged: Option<LogId>,
    /// The last entry (`None` when no entry is left).
    last: Option<LogId>,
    /// A write failed; what sled holds is unknown, so nothing more may be written.
    failed: Option<String>,
}

/// The Raft log in sled.
pub(crate) struct SledLog {
    db: sled::Db,
    state: Mutex<State>,
}

impl SledLog {
    /// Opens (creating) the database in `dir` and checks every entry; also returns what syncs it.
    pub(crate) fn open(dir: &Path) -> Result<(Self, SledSync), String> {
        let created = !dir.exists();
        let (db, state) = without_panics(|| -> Result<(sled::Db, State), String> {
            let db =
                open_db(dir).map_err(|e| format!("sled cannot open {}: {e}", dir.display()))?;
            let state = Self::recover(&db).map_err(|e| format!("{}: {e}", dir.display()))?;
            Ok((db, state))
        })
        .map_err(|panic| format!("sled broke down reading {}: {panic}", dir.display()))??;
        // sled writes `conf` and creates `db` and `blobs/` without syncing them or their
        // directory entries.
        sync_created(dir, created).map_err(|e| format!("cannot sync {}: {e}", dir.display()))?;
        let sync = SledSync::new(db.clone(), dir)
            .map_err(|e| format!("cannot open {}: {e}", dir.join("db").display()))?;
        let log = Self {
            db,
            state: Mutex::new(state),
        };
        Ok((log, sync))
    }

    /// Reads the vote, the committed id and the purge point, and checks every entry.
    fn recover(db: &sled::Db) -> Result<State, String> {
        fn meta<T: serde::de::DeserializeOwned>(
            db: &sled::Db,
            key: &'static [u8],
            what: &'static str,
        ) -> Result<Option<T>, String> {
            let Some(bytes) = db
                .get(key)
                .map_err(|e| format!("cannot read the {what}: {e}"))?
            else {
                return Ok(None);
            };
            codec::decode(what, &bytes)
                .map(Some)
                .map_err(|e| e.to_string())
        }
        let mut state = State {
            vote: meta(db, KEY_VOTE, "vote")?,
            committed: meta::<Option<LogId>>(db, KEY_COMMITTED, "committed id")?.flatten(),
            purged: meta(db, KEY_PURGED, "purge point")?,
            ..State::default()
        };
        for item in db.range(all_entries()) {
            // The index the next entry must have (any, for the first of a log never purged).
            let next = state.last.or(state.purged).map(|l| l.index + 1);
            let expected = || next.map_or("the first entry".into(), |n| format!("entry {n}"));
            let (key, value) = item.map_err(|e| format!("cannot read {}: {e}", expected()))?;
            let index = key_index(&key).ok_or_else(|| format!("a malformed entry key {key:?}"))?;
            let entry = decode_entry(index, &value).map_err(|(_, e)| e)?;
            if next.is_some_and(|n| n != index) {
                return Err(format!(
                    "entry {index} is where {} should be: entries are missing",
                    expected()
                ));
            }
            state.last = Some(entry.log_id);
        }
        Ok(state)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update of the state follows a successful write, so a panic elsewhere while the
        // lock was held leaves it consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The log id of the entry at `index`, if there is one.
    fn id_at(&self, index: u64) -> io::Result<Option<LogId>> {
        let value = self.db.get(entry_key(index)).map_err(io::Error::other)?;
        Ok(value.and_then(|v| entry_log_id(&v)))
    }

    /// Applies `batch`, with the committed id if it changed, as one atomic write.
    fn write(&self, state: &mut State, mut batch: sled::Batch) -> io::Result<()> {
        if let Some(e) = &state.failed {
            return Err(io::Error::other(format!(
                "an earlier log write failed ({e}); no more writes"
            )));
        }
        if state.committed_unwritten {
            let c = codec::encode("committed id", &state.committed).map_err(io::Error::other)?;
            batch.insert(KEY_COMMITTED, c);
        }
        match self.db.apply_batch(batch) {
            Ok(()) => {
                state.committed_unwritten = false;
                Ok(())
            }
            Err(e) => {
                state.failed = Some(e.to_string());
                Err(io::Error::other(e))
            }
        }
    }

    /// Writes `entries` after the log's last, replacing any from the first's index on.
    fn append_locked(&self, state: &mut State, entries: &[(LogId, Vec<u8>)]) -> io::Result<()> {
        let Some(((first, _), (last, _))) = entries.first().zip(entries.last()) else {
            return Ok(());
        };
        let mut batch = sled::Batch::default();
        if let Some(held) = state.last.filter(|l| l.index >= first.index) {
            for index in first.index..=held.index {
                batch.remove(&entry_key(index));
            }
        }
        for (log_id, bytes) in entries {
            let mut value = Vec::with_capacity(ENTRY_HEAD + bytes.len());
            value.extend_from_slice(&log_id.index.to_le_bytes());
            value.extend_from_slice(&log_id.leader_id.term.to_le_bytes());
            value.extend_from_slice(&log_id.leader_id.node_id.to_le_bytes());
            value.extend_from_slice(bytes);
            batch.insert(&entry_key(log_id.index), value);
        }
        self.write(state, batch)?;
        state.last = Some(*last);
        Ok(())
    }

    /// The database's size on disk, as sled counts it.
    #[cfg(test)]
    pub(crate) fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// The entry in `value`, stored at `index`, checked.
fn decode_entry(index: u64, value: &[u8]) -> Result<Entry, (u64, String)> {
    let head = entry_log_id(value)
        .ok_or_else(|| (index, format!("entry {index} is too short for its log id")))?;
    if head.index != index {
        return Err((
            index,
            format!("entry {index} says it is entry {}", head.index),
        ));
    }
    let entry: Entry = codec::decode("log entry", &value[ENTRY_HEAD..])
        .map_err(|e| (index, format!("entry {index}: {e}")))?;
    if entry.log_id != head {
        return Err((
            index,
            format!(
                "entry {index} holds {} but is stored as {head}",
                entry.log_id
            ),
        ));
    }
    Ok(entry)
}

impl LogEngine for SledLog {
    fn append(&self, entries: &[(LogId, Vec<u8>)]) -> io::Result<usize> {
        let mut state = self.lock();
        let mut held = 0;
        // Only where the entries overlap the log can it hold them already (a pre-append).
        while let Some((id, _)) = entries.get(held) {
            if state.last.is_none_or(|l| id.index > l.index) || self.id_at(id.index)? != Some(*id) {
                break;
            }
            held += 1;
        }
        let entries = &entries[held..];
        self.append_locked(&mut state, entries)?;
        Ok(entries.len())
    }

    fn append_if(
        &self,
        vote: &Vote,
        prev: Option<LogId>,
        entries: &[(LogId, Vec<u8>)],
    ) -> io::Result<bool> {
        let mut state = self.lock();
        let last = state.last.max(state.purged);
        if !vote.is_committed() || state.vote.as_ref() != Some(vote) || last != prev {
            return Ok(false);
        }
        self.append_locked(&mut state, entries)?;
        Ok(true)
    }

    fn id_before(&self, index: u64) -> Option<LogId> {
        let i = index.checked_sub(1)?;
        let purged = self.lock().purged;
        self.id_at(i)
            .ok()
            .flatten()
            .or(purged.filter(|p| p.index == i))
    }

    fn save_vote(&self, vote: &Vote) -> io::Result<()> {
        let bytes = codec::encode("vote", vote).map_err(io::Error::other)?;
        let mut batch = sled::Batch::default();
        batch.insert(KEY_VOTE, bytes);
        let mut state = self.lock();
        self.write(&mut state, batch)?;
        state.vote = Some(*vote);
        Ok(())
    }

    fn save_committed(&self, committed: Option<LogId>) -> io::Result<()> {
        let mut state = self.lock();
        if state.committed != committed {
            state.committed = committed;
            state.committed_unwritten = true;
        }
        Ok(())
    }

    fn truncate(&self, from: u64) -> io::Result<()> {
        let mut state = self.lock();
        let Some(last) = state.last.filter(|l| l.index >= from) else {
            return Ok(());
        };
        let new_last = match from.checked_sub(1) {
            Some(i) => self.id_at(i)?,
            None => None,
        };
        let mut batch = sled::Batch::default();
        for index in from..=last.index {
            batch.remove(&entry_key(index));
        }
        self.write(&mut state, batch)?;
        state.last = new_last;
        Ok(())
    }

    fn purge(&self, to: LogId) -> io::Result<()> {
        let mut state = self.lock();
        let purged = state.purged.max(Some(to)).unwrap_or(to);
        let mut batch = sled::Batch::default();
        batch.insert(
            KEY_PURGED,
            codec::encode("purge point", &purged).map_err(io::Error::other)?,
        );
        let first = match state.purged {
            Some(p) => Some(p.index + 1),
            None => match self.db.range(all_entries()).next() {
                Some(item) => key_index(&item.map_err(io::Error::other)?.0),
                None => None,
            },
        };
        if let (Some(first), Some(last)) = (first, state.last) {
            for index in first..=purged.index.min(last.index) {
                batch.remove(&entry_key(index));
            }
        }
        self.write(&mut state, batch)?;
        state.purged = Some(purged);
        if state.last.is_some_and(|l| l.index <= purged.index) {
            state.last = None;
        }
        Ok(())
    }

    /// sled gives back the space of deleted entries itself, as it rewrites its segments.
    fn reclaim_purged(&self) -> io::Result<()> {
        Ok(())
    }

    fn vote(&self) -> Option<Vote> {
        self.lock().vote
    }

    fn committed(&self) -> Option<LogId> {
        self.lock().committed
    }

    fn bounds(&self) -> (Option<LogId>, Option<LogId>) {
        let state = self.lock();
        (state.purged, state.last.max(state.purged))
    }

    fn read(
        &self,
        (start, end): (Bound<u64>, Bound<u64>),
        byte_budget: Option<usize>,
    ) -> Result<Vec<Entry>, (u64, String)> {
        let first = match start {
            Bound::Included(s) => s,
            Bound::Excluded(s) => s.saturating_add(1),
            Bound::Unbounded => 0,
        };
        if matches!(end, Bound::Excluded(e) if first >= e) {
            return Ok(Vec::new());
        }
        let range = (
            Bound::Included(entry_key(first)),
            match end {
                Bound::Unbounded => Bound::Included(entry_key(u64::MAX)),
                b => b.map(entry_key),
            },
        );
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for item in self.db.range(range) {
            let next = out.last().map_or(first, |e: &Entry| e.log_id.index + 1);
            let (key, value) = item.map_err(|e| (next, format!("cannot read it: {e}")))?;
            if byte_budget.is_some_and(|b| !out.is_empty() && bytes + value.len() > b) {
                break;
            }
            bytes += value.len();
            let index = key_index(&key).ok_or_else(|| (next, "a malformed entry key".into()))?;
            out.push(decode_entry(index, &value)?);
        }
        Ok(out)
    }
}

/// How long an open waits for a database of this process, closed just before, to let go of its
/// lock.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Opens sled's database in `dir`.
///
/// sled holds a lock on its `db` file until the last of its threads lets go of the database,
/// which can be a moment after the `Db` was dropped: an open right after a close in the same
/// process (a restart in the tests) waits for that. Another process cannot hold it: the data
/// directory's own lock keeps a second coordinator out before storage is opened.
fn open_db(dir: &Path) -> sled::Result<sled::Db> {
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let opened = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            // The flusher syncs whenever a write needs it; sled's own periodic flush would only
            // add flushes competing with it.
            .flush_every_ms(None)
            .open();
        match opened {
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Runs `f`, turning a panic in it into an error that carries the panic's message.
///
/// sled 0.34 panics on some damaged files at open (an index out of bounds reading a log cut
/// short); a replica must refuse such a directory with a message, not crash. While `f` runs the
/// panic hook is this thread's: a panic of `f` is kept quiet (it becomes the error), one of any
/// other thread goes to the hook that was there before. Opens take turns, so the hooks are put
/// back in the order they were set.
fn without_panics<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static TURN: Mutex<()> = Mutex::new(());
    let _turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    let opener = std::thread::current().id();
    let caught = std::sync::Arc::new(Mutex::new(None::<String>));
    let previous = std::sync::Arc::new(std::panic::take_hook());
    std::panic::set_hook(Box::new({
        let (caught, previous) = (caught.clone(), previous.clone());
        move |info| {
            if std::thread::current().id() == opener {
                let payload = info.payload();
                let what = payload
                    .downcast_ref::<&str>()
                    .copied()
                    .or(payload.downcast_ref::<String>().map(String::as_str))
                    .unwrap_or("a panic");
                let at = info
                    .location()
                    .map_or(String::new(), |l| format!(" (at {l})"));
                *caught.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(format!("{what}{at}"));
            } else {
                previous(info);
            }
        }
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // Dropping this thread's hook leaves `previous` with one owner again.
    drop(std::panic::take_hook());
    match std::sync::Arc::try_unwrap(previous) {
        Ok(hook) => std::panic::set_hook(hook),
        Err(shared) => std::panic::set_hook(Box::new(move |info| shared(info))),
    }
    result.map_err(|_| {
        caught
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| "a panic".into())
    })
}

/// Syncs at open what sled created without syncing: its files and the directories naming them
/// (the Raft directory too when sled's was new).
fn sync_created(dir: &Path, created: bool) -> io::Result<()> {
    for file in ["conf", "db"] {
        File::open(dir.join(file))?.sync_all()?;
    }
    File::open(dir.join(BLOBS))?.sync_all()?;
    File::open(dir)?.sync_all()?;
    if created {
        if let Some(parent) = dir.parent() {
            File::open(parent)?.sync_all()?;
        }
    }
    Ok(())
}

/// What makes the sled log durable: sled's flush, then `fdatasync` of its log file, of the blob
/// files written since the last sync, and of directories whose entries changed. A sync covers
/// every write that returned before it started.
pub(crate) struct SledSync {
    db: sled::Db,
    /// sled's single log file (`db`), opened once.
    log_file: File,
    dir: PathBuf,
    /// The names in `dir` when it was last synced (sled adds and removes `snap.*` files).
    dir_names: BTreeSet<OsString>,
    /// Blob files already synced (sled never rewrites a blob in place).
    synced_blobs: BTreeSet<OsString>,
}

impl SledSync {
    fn new(db: sled::Db, dir: &Path) -> io::Result<Self> {
        Ok(Self {
            log_file: File::open(dir.join("db"))?,
            db,
            dir: dir.to_path_buf(),
            dir_names: names_in(dir)?,
            // sync_created synced the blobs directory, but not the blobs in it: the first sync
            // syncs them all.
            synced_blobs: BTreeSet::new(),
        })
    }

    /// Syncs the blob files not synced yet, and their directory. `before` is what the blob
    /// directory held before the flush: sled writes a blob after reserving its place in the log
    /// and before that place can reach the disk, so the flush waited for every blob in `before`
    /// to be written whole. A blob that appeared during the flush is synced too (the flush may
    /// have made the message pointing at it stable), but it may have been written only in part,
    /// so it is synced again next time.
    fn sync_blobs(&mut self, before: &BTreeSet<OsString>) -> io::Result<()> {
        let blob_dir = self.dir.join(BLOBS);
        let after = names_in(&blob_dir)?;
        let mut new = false;
        for name in after.difference(&self.synced_blobs) {
            match File::open(blob_dir.join(name)) {
                Ok(f) => f.sync_data()?,
                // sled removed it meanwhile.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            new = true;
        }
        if new {
            File::open(&blob_dir)?.sync_all()?;
        }
        self.synced_blobs = after
            .into_iter()
            .filter(|n| before.contains(n) || self.synced_blobs.contains(n))
            .collect();
        Ok(())
    }
}

/// The names of the files in `dir`.
fn names_in(dir: &Path) -> io::Result<BTreeSet<OsString>> {
    std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

impl LogSync for SledSync {
    fn sync(&mut self) -> io::Result<()> {
        let blobs_before = names_in(&self.dir.join(BLOBS))?;
        self.db.flush().map_err(io::Error::other)?;
        self.log_file.sync_data()?;
        self.sync_blobs(&blobs_before)?;
        let names = names_in(&self.dir)?;
        if names != self.dir_names {
            File::open(&self.dir)?.sync_all()?;
            self.dir_names = names;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "sled_log_tests.rs"]
mod tests;

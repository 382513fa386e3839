//! The Raft log files: an in-memory index over the segments of [`super::segments`], the writer that
//! appends to the newest segment, and recovery at open.
//!
//! Every write lands in the page cache at once and is readable as soon as the call returns; it is
//! durable only after the [`super::flusher`] has synced the files this module marked unsynced. The
//! callers (the log store) decide who waits for that sync.
//!
//! Recovery reads every segment in order and replays its records. A record that is cut short or
//! fails its checksum at the end of the newest segment is a write torn by a crash before it was
//! synced: the file is cut there and the log goes on from the last whole record. A segment just
//! before the newest that ends cleanly without its end record was being closed when the crash
//! came: the newest segment, none of which was acknowledged, is dropped. Any other damage in an
//! older segment, an older segment without its end record, or records out of order, mean the log
//! is damaged and the replica refuses to start. (A lost *synced* tail is caught by the witness, which knows the vote and a lower bound of
//! the committed index.)

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Bound, RangeBounds};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::codec;
use crate::types::{Entry, LogId, Vote};

use super::engine::{LogEngine, LogSync};
use super::log_index::{Loc, Log, Segment};
use super::segments::{self, Kind, ENTRY_HEAD, SEGMENT_BYTES};

/// Files written since the last sync; the flusher takes and syncs them.
#[derive(Default)]
struct Unsynced {
    files: Vec<Arc<File>>,
    /// A segment was created or deleted: the directory itself must be synced.
    dir: bool,
}

impl Unsynced {
    fn add(&mut self, file: &Arc<File>) {
        if !self.files.iter().any(|f| Arc::ptr_eq(f, file)) {
            self.files.push(file.clone());
        }
    }
}

/// The log files of one replica.
pub(crate) struct Wal {
    dir: PathBuf,
    /// A segment this long is closed ([`SEGMENT_BYTES`] but in tests).
    segment_bytes: u64,
    log: Mutex<Log>,
    unsynced: Arc<Mutex<Unsynced>>,
}

/// What [`Wal::open`] found.
pub(crate) struct Recovered {
    /// A torn tail was cut off the newest segment: (file, what was wrong).
    pub torn_tail: Option<(PathBuf, String)>,
}

fn open_rw(path: &Path, create: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(create)
        .open(path)
}

impl Wal {
    /// Opens the log in `dir` (which must exist), recovering it from its segments.
    pub(crate) fn open(dir: &Path) -> Result<(Self, Recovered), String> {
        Self::open_with(dir, SEGMENT_BYTES)
    }

    fn open_with(dir: &Path, segment_bytes: u64) -> Result<(Self, Recovered), String> {
        let io_err =
            |what: &str, path: &Path, e: io::Error| format!("{what} {}: {e}", path.display());
        let found = segments::list(dir).map_err(|e| io_err("cannot list", dir, e))?;
        let mut log = Log::default();
        let mut torn_tail = None;
        let mut newest_closed = false;
        // The newest segment, dropped because the one before it was never closed on disk.
        let mut discarded = None;
        let last = found.len().saturating_sub(1);
        for (i, (seq, path)) in found.iter().enumerate() {
            let file = Arc::new(open_rw(path, false).map_err(|e| io_err("cannot open", path, e))?);
            log.segments.insert(
                *seq,
                Segment {
                    path: path.clone(),
                    file: file.clone(),
                    max_index: None,
                },
            );
            let end = segments::scan(&file, |offset, kind, payload| {
                log.replay(*seq, offset, kind, payload)
            })
            .map_err(|e| io_err("cannot read", path, e))?
            .map_err(|e| format!("{}: {e}", path.display()))?;
            let unfinished = end.damage.is_some() || !end.closed;
            if i < last && unfinished {
                if i + 1 < last || end.damage.is_some() {
                    return Err(match &end.damage {
                        Some(damage) => format!("{}: {damage}", path.display()),
                        None => format!(
                            "{}: no end record after {} bytes, though newer segments follow (cut short?)",
                            path.display(),
                            end.valid_len
                        ),
                    });
                }
                // The segment before the newest ends cleanly but was never closed on disk: the
                // crash came before the sync that would have made its end record durable. The flusher syncs files
                // in the order they were written, so nothing in the newest segment was
                // acknowledged either: it is dropped, and this one is written on.
                discarded = found.get(last).cloned();
            }
            if let Some(damage) = end.damage {
                // A write torn by a crash: cut it off so that nothing after it can be mistaken
                // for a record later.
                let file = &log.segments[seq].file;
                file.set_len(end.valid_len)
                    .and_then(|_| file.sync_all())
                    .map_err(|e| io_err("cannot cut the torn tail of", path, e))?;
                torn_tail = Some((path.clone(), damage));
            }
            log.active = *seq;
            log.active_len = end.valid_len;
            newest_closed = end.closed;
            if discarded.is_some() {
                break;
            }
        }
        if let Some((_, path)) = &discarded {
            std::fs::remove_file(path)
                .and_then(|_| File::open(dir)?.sync_all())
                .map_err(|e| io_err("cannot remove the unfinished segment", path, e))?;
            tracing::warn!(file = %path.display(), "dropped a log segment started just before a crash (the previous one was never closed on disk)");
        }
        log.check_start()?;
        let wal = Self {
            dir: dir.to_path_buf(),
            segment_bytes,
            log: Mutex::new(log),
            unsynced: Arc::default(),
        };
        if found.is_empty() || newest_closed {
            // A new log; or a crash came between closing a segment and starting the next.
            let mut log = wal.lock();
            let next = log.active + 1;
            let restated = log.restatement().map_err(|e| e.to_string())?;
            wal.start_segment(&mut log, next)
                .and_then(|_| wal.write_at_end(&mut log, &restated))
                .map_err(|e| io_err("cannot create a segment in", dir, e))?;
        }
        Ok((wal, Recovered { torn_tail }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        // Every update of the log leaves it consistent before it can fail, so a panic elsewhere
        // while the lock was held does not make it unusable.
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the flusher syncs: the files this log marks unsynced.
    pub(crate) fn syncer(&self) -> WalSync {
        WalSync {
            dir: self.dir.clone(),
            unsynced: self.unsynced.clone(),
        }
    }

    /// Creates segment `seq`, empty, and makes it the one written.
    fn start_segment(&self, log: &mut Log, seq: u64) -> io::Result<()> {
        let path = self.dir.join(segments::file_name(seq));
        let file = open_rw(&path, true)?;
        // Filled with zeros and synced before use: appends then overwrite allocated blocks (see
        // `segments`). Once per segment, on the append path: a few milliseconds per 4 MiB of log.
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < self.segment_bytes {
            let n = (self.segment_bytes - at).min(zeros.len() as u64) as usize;
            file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        file.sync_all()?;
        let file = Arc::new(file);
        log.segments.insert(
            seq,
            Segment {
                path,
                file,
                max_index: None,
            },
        );
        log.active = seq;
        log.active_len = 0;
        self.unsynced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .dir = true;
        Ok(())
    }

    /// Appends `records` to the newest segment (starting a new one first if it is full) and marks
    /// the file unsynced. Returns the segment and the offset the records start at.
    fn write(&self, log: &mut Log, records: &[u8]) -> io::Result<(u64, u64)> {
        if let Some(e) = &log.failed {
            return Err(io::Error::other(format!(
                "an earlier log write failed ({e}); no more writes"
            )));
        }
        let result = (|| -> io::Result<(u64, u64)> {
            if log.active_len >= self.segment_bytes {
                let restated = log.restatement().map_err(io::Error::other)?;
                let mut end = Vec::new();
                segments::put_record(&mut end, Kind::SegmentEnd, &[]);
                self.write_at_end(log, &end)?;
                self.start_segment(log, log.active + 1)?;
                self.write_at_end(log, &restated)?;
            }
            let at = log.active_len;
            if log.committed_unwritten {
                let mut with_hint = Vec::with_capacity(records.len() + 64);
                with_hint.extend_from_slice(records);
                let c = codec::encode("committed id", &log.committed).map_err(io::Error::other)?;
                segments::put_record(&mut with_hint, Kind::Committed, &[&c]);
                self.write_at_end(log, &with_hint)?;
                log.committed_unwritten = false;
            } else {
                self.write_at_end(log, records)?;
            }
            Ok((log.active, at))
        })();
        if let Err(e) = &result {
            log.failed = Some(e.to_string());
        }
        result
    }

    fn write_at_end(&self, log: &mut Log, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let segment = log
            .segments
            .get(&log.active)
            .ok_or_else(|| io::Error::other("the active segment is missing"))?;
        segment.file.write_all_at(bytes, log.active_len)?;
        self.unsynced
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(&segment.file);
        log.active_len += bytes.len() as u64;
        Ok(())
    }

    fn append_locked(&self, log: &mut Log, entries: &[(LogId, Vec<u8>)]) -> io::Result<()> {
        let mut records = Vec::with_capacity(
            entries
                .iter()
                .map(|(_, b)| b.len() + segments::RECORD_HEADER + 1 + ENTRY_HEAD)
                .sum(),
        );
        let mut spans = Vec::with_capacity(entries.len());
        for (log_id, bytes) in entries {
            let start = records.len();
            segments::put_entry(&mut records, log_id, bytes);
            spans.push((*log_id, start as u64, (records.len() - start) as u32));
        }
        let (seq, at) = self.write(log, &records)?;
        let records = bytes::Bytes::from(records);
        for (log_id, start, len) in spans {
            let loc = Loc {
                seq,
                offset: at + start,
                len,
                log_id,
            };
            log.entries.insert(log_id.index, loc);
            let end = start as usize + len as usize;
            log.remember(loc, records.slice(start as usize..end));
        }
        if let (Some((log_id, _)), Some(segment)) = (entries.last(), log.segments.get_mut(&seq)) {
            segment.max_index = Some(log_id.index);
        }
        Ok(())
    }

    fn write_record(
        &self,
        kind: Kind,
        payload: &[u8],
        update: impl FnOnce(&mut Log),
    ) -> io::Result<()> {
        let mut record = Vec::new();
        segments::put_record(&mut record, kind, &[payload]);
        let mut log = self.lock();
        self.write(&mut log, &record)?;
        update(&mut log);
        Ok(())
    }

    /// Deletes the oldest segments whose entries are all purged. Call only once the purge record
    /// is durable: until then a crash would bring back a log that needs those entries.
    pub(crate) fn delete_purged_segments(&self) -> io::Result<usize> {
        let doomed: Vec<PathBuf> = {
            let mut log = self.lock();
            let purged = log.purged.map(|p| p.index);
            let seqs: Vec<u64> = log
                .segments
                .iter()
                .take_while(|(seq, s)| {
                    **seq != log.active
                        && s.max_index.is_none_or(|m| purged.is_some_and(|p| m <= p))
                })
                .map(|(seq, _)| *seq)
                .collect();
            seqs.iter()
                .filter_map(|seq| log.segments.remove(seq))
                .map(|s| s.path)
                .collect()
        };
        for path in &doomed {
            std::fs::remove_file(path)?;
        }
        if !doomed.is_empty() {
            self.unsynced
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .dir = true;
        }
        Ok(doomed.len())
    }

    /// Number of segment files.
    #[cfg(test)]
    pub(crate) fn segment_count(&self) -> usize {
        self.lock().segments.len()
    }

    /// Reads the entries in `range`, stopping before the byte budget would be exceeded (but
    /// always returning at least one entry when the range has one).
    pub(crate) fn read<RB: RangeBounds<u64>>(
        &self,
        range: RB,
        byte_budget: Option<usize>,
    ) -> Result<Vec<Entry>, (u64, String)> {
        let locs: Vec<(Arc<File>, Loc, Option<bytes::Bytes>)> = {
            let log = self.lock();
            let (start, end) = (range.start_bound().cloned(), range.end_bound().cloned());
            if matches!((start, end), (Bound::Included(s), Bound::Excluded(e)) if s >= e) {
                return Ok(Vec::new());
            }
            let mut bytes = 0usize;
            let mut out = Vec::new();
            for loc in log.entries.range((start, end)).map(|(_, l)| *l) {
                if byte_budget.is_some_and(|b| !out.is_empty() && bytes + loc.len as usize > b) {
                    break;
                }
                bytes += loc.len as usize;
                let Some(segment) = log.segments.get(&loc.seq) else {
                    return Err((loc.log_id.index, "its segment is gone".into()));
                };
                out.push((segment.file.clone(), loc, log.recent_record(&loc)));
            }
            out
        };
        read_entries(&locs)
    }
}

/// The segment log's durable half: `fdatasync` of the segments written since the last sync, and
/// of the directory when a segment was created or deleted.
pub(crate) struct WalSync {
    dir: PathBuf,
    unsynced: Arc<Mutex<Unsynced>>,
}

impl LogSync for WalSync {
    fn sync(&mut self) -> io::Result<()> {
        let Unsynced { files, dir } =
            std::mem::take(&mut *self.unsynced.lock().unwrap_or_else(PoisonError::into_inner));
        for file in &files {
            file.sync_data()?;
        }
        if dir {
            File::open(&self.dir)?.sync_all()?;
        }
        Ok(())
    }
}

/// The segment log as the log store sees it: each write takes the index's lock, appends its
/// records to the newest segment and updates the index before it lets go.
impl LogEngine for Wal {
    /// Appends encoded entries (log id, bincode bytes), in index order. Leading entries the log
    /// already holds with the same ids (written by [`Self::append_if`]) are not written again;
    /// entries it holds at the indexes of the rest are replaced, as openraft, which did not know
    /// of them, expects. Returns how many entries were written.
    fn append(&self, entries: &[(LogId, Vec<u8>)]) -> io::Result<usize> {
        let mut log = self.lock();
        let held = entries
            .iter()
            .take_while(|(id, _)| log.entries.get(&id.index).map(|l| l.log_id) == Some(*id))
            .count();
        let entries = &entries[held..];
        let Some((first, _)) = entries.first() else {
            return Ok(0);
        };
        if log.last().is_some_and(|last| last.index >= first.index) {
            let mut record = Vec::new();
            segments::put_record(&mut record, Kind::Truncated, &[&first.index.to_le_bytes()]);
            self.write(&mut log, &record)?;
            log.truncate(first.index);
        }
        self.append_locked(&mut log, entries)?;
        Ok(entries.len())
    }

    /// Appends `entries` only if the log's vote is `vote`, a leader's, and the log ends at `prev`
    /// (see `pre_append`): the entries then extend the log just as that leader's AppendEntries
    /// would. Returns whether they were written.
    fn append_if(
        &self,
        vote: &Vote,
        prev: Option<LogId>,
        entries: &[(LogId, Vec<u8>)],
    ) -> io::Result<bool> {
        let mut log = self.lock();
        let last = log.last().max(log.purged);
        if !vote.is_committed() || log.vote.as_ref() != Some(vote) || last != prev {
            return Ok(false);
        }
        self.append_locked(&mut log, entries)?;
        Ok(true)
    }

    /// The id of the entry just before `index` (the purge point when that entry is purged).
    fn id_before(&self, index: u64) -> Option<LogId> {
        let i = index.checked_sub(1)?;
        let log = self.lock();
        log.entries
            .get(&i)
            .map(|l| l.log_id)
            .or(log.purged.filter(|p| p.index == i))
    }

    fn save_vote(&self, vote: &Vote) -> io::Result<()> {
        let bytes = codec::encode("vote", vote).map_err(io::Error::other)?;
        self.write_record(Kind::Vote, &bytes, |log| log.vote = Some(*vote))
    }

    /// Notes the committed id. It is a hint for replay, so it costs no write of its own: the next
    /// record written (an entry, most often) carries it. A replica that crashes before that replays
    /// from an older hint, and the leader tells it the rest.
    fn save_committed(&self, committed: Option<LogId>) -> io::Result<()> {
        let mut log = self.lock();
        if log.committed != committed {
            log.committed = committed;
            log.committed_unwritten = true;
        }
        Ok(())
    }

    /// Removes entries from `from` on.
    fn truncate(&self, from: u64) -> io::Result<()> {
        self.write_record(Kind::Truncated, &from.to_le_bytes(), |log| {
            log.truncate(from)
        })
    }

    /// Records the purge point and drops the entries up to it from the index. The segments
    /// holding them stay until [`Self::delete_purged_segments`], which must wait for a sync.
    fn purge(&self, to: LogId) -> io::Result<()> {
        let bytes = codec::encode("purge point", &to).map_err(io::Error::other)?;
        self.write_record(Kind::Purged, &bytes, |log| log.purge(to))
    }

    fn reclaim_purged(&self) -> io::Result<()> {
        self.delete_purged_segments().map(drop)
    }

    fn vote(&self) -> Option<Vote> {
        self.lock().vote
    }

    fn committed(&self) -> Option<LogId> {
        self.lock().committed
    }

    /// (last purged, last) log ids; `last` falls back to the purge point when no entry is left.
    fn bounds(&self) -> (Option<LogId>, Option<LogId>) {
        let log = self.lock();
        let last = log.last();
        (log.purged, last.max(log.purged))
    }

    fn read(
        &self,
        range: (Bound<u64>, Bound<u64>),
        byte_budget: Option<usize>,
    ) -> Result<Vec<Entry>, (u64, String)> {
        Wal::read(self, range, byte_budget)
    }
}

/// Decodes the records at `locs`: a recent one from memory, the others from their files, one
/// read per run of adjacent records in one file.
fn read_entries(
    locs: &[(Arc<File>, Loc, Option<bytes::Bytes>)],
) -> Result<Vec<Entry>, (u64, String)> {
    let mut out = Vec::with_capacity(locs.len());
    let mut i = 0;
    let mut buf = Vec::new();
    while i < locs.len() {
        let (file, first, recent) = &locs[i];
        if let Some(record) = recent {
            out.push(decode_entry(first, record)?);
            i += 1;
            continue;
        }
        let mut j = i + 1;
        let mut end = first.offset + first.len as u64;
        while j < locs.len()
            && locs[j].2.is_none()
            && locs[j].1.seq == first.seq
            && locs[j].1.offset == end
        {
            end += locs[j].1.len as u64;
            j += 1;
        }
        buf.resize((end - first.offset) as usize, 0);
        file.read_exact_at(&mut buf, first.offset)
            .map_err(|e| (first.log_id.index, format!("cannot read it: {e}")))?;
        for (_, loc, _) in &locs[i..j] {
            let at = (loc.offset - first.offset) as usize;
            out.push(decode_entry(loc, &buf[at..at + loc.len as usize])?);
        }
        i = j;
    }
    Ok(out)
}

/// The entry in `record`, the record at `loc`, checked.
fn decode_entry(loc: &Loc, record: &[u8]) -> Result<Entry, (u64, String)> {
    let index = loc.log_id.index;
    let (kind, payload) = segments::check_record(record).map_err(|e| (index, e))?;
    if kind != Kind::Entry || payload.len() < ENTRY_HEAD {
        return Err((index, "the record there is not an entry".into()));
    }
    codec::decode("log entry", &payload[ENTRY_HEAD..]).map_err(|e| (index, e.to_string()))
}

#[cfg(test)]
#[path = "wal_tests.rs"]
mod tests;

//! The Raft log's in-memory index: where each entry's record is, the vote, the committed id and
//! the purge point, the segments, and the newest entries' records; and how recovery rebuilds it
//! from the records read back at open ([`Log::replay`]). The files themselves are written and read
//! by [`super::wal`], which keeps this index up to date with every write under one lock.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use crate::codec;
use crate::types::{LogId, Vote};

use super::segments::{self, Kind};

/// How many of the newest entries' records [`Log::remember`] keeps, and how many bytes at most.
pub(super) const RECENT_ENTRIES: usize = 64;
pub(super) const RECENT_BYTES: usize = 4 << 20;

/// Where one entry's record is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Loc {
    pub(super) seq: u64,
    pub(super) offset: u64,
    /// The whole record, header included.
    pub(super) len: u32,
    pub(super) log_id: LogId,
}

pub(super) struct Segment {
    pub(super) path: PathBuf,
    pub(super) file: Arc<File>,
    /// The highest entry index written to this segment, if any.
    pub(super) max_index: Option<u64>,
}

/// The log as recovered and kept up to date by every write.
#[derive(Default)]
pub(super) struct Log {
    pub(super) entries: BTreeMap<u64, Loc>,
    pub(super) purged: Option<LogId>,
    pub(super) vote: Option<Vote>,
    pub(super) committed: Option<LogId>,
    /// `committed` changed since it was last written: the next write carries it (see
    /// [`super::wal::Wal::save_committed`]).
    pub(super) committed_unwritten: bool,
    pub(super) segments: BTreeMap<u64, Segment>,
    /// Sequence number and length of the segment being written.
    pub(super) active: u64,
    pub(super) active_len: u64,
    /// A write failed part way; the file's tail is unknown, so nothing more may be written.
    pub(super) failed: Option<String>,
    /// The records of the newest entries, by index: replication and apply read an entry right
    /// after it was appended (three times on a leader), and this spares them the file.
    pub(super) recent: BTreeMap<u64, (Loc, bytes::Bytes)>,
}

impl Log {
    pub(super) fn last(&self) -> Option<LogId> {
        self.entries.last_key_value().map(|(_, l)| l.log_id)
    }

    /// The index the next entry must have, if the log has any position yet.
    pub(super) fn next_index(&self) -> Option<u64> {
        let last = self.last().map(|l| l.index);
        let purged = self.purged.map(|p| p.index);
        last.max(purged).map(|i| i + 1)
    }

    pub(super) fn purge(&mut self, to: LogId) {
        if self.purged.is_none_or(|p| p < to) {
            self.purged = Some(to);
        }
        self.entries = self.entries.split_off(&(to.index + 1));
    }

    pub(super) fn truncate(&mut self, from: u64) {
        self.entries.split_off(&from);
    }

    /// Keeps `record` (the record at `loc`) among the recent ones, forgetting the oldest past
    /// [`RECENT_ENTRIES`] or [`RECENT_BYTES`]. A record is served from here only while its
    /// location is the one the index holds, so truncated entries are never read back.
    pub(super) fn remember(&mut self, loc: Loc, record: bytes::Bytes) {
        self.recent.insert(loc.log_id.index, (loc, record));
        let bytes = |recent: &BTreeMap<u64, (Loc, bytes::Bytes)>| -> usize {
            recent.values().map(|(_, r)| r.len()).sum()
        };
        while self.recent.len() > RECENT_ENTRIES || bytes(&self.recent) > RECENT_BYTES {
            self.recent.pop_first();
        }
    }

    /// The record at `loc`, if it is among the recent ones.
    pub(super) fn recent_record(&self, loc: &Loc) -> Option<bytes::Bytes> {
        self.recent
            .get(&loc.log_id.index)
            .filter(|(l, _)| l == loc)
            .map(|(_, r)| r.clone())
    }

    /// Replays one record read back at open.
    pub(super) fn replay(
        &mut self,
        seq: u64,
        offset: u64,
        kind: Kind,
        payload: &[u8],
    ) -> Result<(), String> {
        let decode_err = |e: codec::CodecError| e.to_string();
        match kind {
            Kind::Entry => {
                let log_id = segments::entry_log_id(payload)
                    .ok_or_else(|| "an entry record too short for its log id".to_string())?;
                // With entries left, the next must follow the last. With none, older segments
                // may have been deleted after a purge recorded further on: the gap is checked
                // once every record is read ([`Log::check_start`]).
                match (self.last(), self.next_index()) {
                    (Some(_), Some(next)) if log_id.index != next => {
                        return Err(format!(
                            "entry {} follows the log's end; expected entry {next}",
                            log_id.index
                        ));
                    }
                    (None, Some(next)) if log_id.index < next => {
                        return Err(format!(
                            "entry {} is at or before the purge point; expected entry {next} or later",
                            log_id.index
                        ));
                    }
                    _ => {}
                }
                let len = (segments::RECORD_HEADER + 1 + payload.len()) as u32;
                self.entries.insert(
                    log_id.index,
                    Loc {
                        seq,
                        offset,
                        len,
                        log_id,
                    },
                );
                if let Some(s) = self.segments.get_mut(&seq) {
                    s.max_index = Some(log_id.index);
                }
            }
            Kind::Vote => self.vote = Some(codec::decode("vote", payload).map_err(decode_err)?),
            Kind::Committed => {
                self.committed = codec::decode("committed id", payload).map_err(decode_err)?
            }
            Kind::Purged => self.purge(codec::decode("purge point", payload).map_err(decode_err)?),
            // The scan stops at an end record; it never reaches here.
            Kind::SegmentEnd => {}
            Kind::Truncated => {
                let bytes: [u8; 8] = payload
                    .try_into()
                    .map_err(|_| "a truncation record of the wrong size".to_string())?;
                self.truncate(u64::from_le_bytes(bytes));
            }
        }
        Ok(())
    }

    /// After recovery: the first entry left must follow the purge point.
    pub(super) fn check_start(&self) -> Result<(), String> {
        match (self.purged, self.entries.first_key_value()) {
            (Some(p), Some((&first, _))) if first != p.index + 1 => Err(format!(
                "the log was purged up to entry {} but its first entry is {first}: entries are missing",
                p.index
            )),
            _ => Ok(()),
        }
    }

    /// Records restating the vote, committed id and purge point: the start of a new segment.
    pub(super) fn restatement(&self) -> Result<Vec<u8>, codec::CodecError> {
        let mut out = Vec::new();
        if let Some(v) = &self.vote {
            segments::put_record(&mut out, Kind::Vote, &[&codec::encode("vote", v)?]);
        }
        if self.committed.is_some() {
            let c = codec::encode("committed id", &self.committed)?;
            segments::put_record(&mut out, Kind::Committed, &[&c]);
        }
        if let Some(p) = &self.purged {
            segments::put_record(&mut out, Kind::Purged, &[&codec::encode("purge point", p)?]);
        }
        Ok(out)
    }
}

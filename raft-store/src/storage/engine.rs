//! The seam between openraft's log storage and the files that hold the log.
//!
//! A `LogEngine` keeps the entries, the vote, the committed id and the purge point; whatever it
//! is given is readable as soon as the call returns, and durable only once its `LogSync` has run.
//! Two engines implement it: coord's own segment files ([`super::wal`], the default) and sled
//! (`sled_log`, `--raft-log sled`). The log store, the flusher's group commit, pre-appends and
//! the witness are the same code over either; an engine only stores and syncs.
//!
//! A data directory keeps the engine it was created with, recorded in `raft/log-engine`. Opening
//! it with the other engine is refused (coord does not convert a log from one to the other).

use std::fmt;
use std::io;
use std::ops::Bound;
use std::path::Path;

use crate::types::{Entry, LogId, Vote};

use super::{files, segments};

/// Which engine holds a replica's Raft log (`--raft-log`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RaftLogEngine {
    /// coord's segment files: one `fdatasync` a group commit, a start that reads only the live
    /// segments. The default: it measured faster on both counts (docs/design.md, "Why not sled").
    #[default]
    Segments,
    /// A sled 0.34 database, flushed and then `fdatasync`ed by coord on every group commit.
    Sled,
}

impl RaftLogEngine {
    /// The name `--raft-log` takes and `raft/log-engine` holds.
    pub fn name(self) -> &'static str {
        match self {
            Self::Segments => "segments",
            Self::Sled => "sled",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Segments, Self::Sled]
            .into_iter()
            .find(|e| e.name() == name)
    }
}

impl fmt::Display for RaftLogEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the log store needs of an engine. Every write is readable when it returns and durable
/// after the next [`LogSync::sync`] that starts after it; writes reach the disk in the order they
/// were made. A write that failed part way leaves the engine refusing every later write.
pub(crate) trait LogEngine: Send + Sync + 'static {
    /// Appends encoded entries (log id, bincode bytes), in index order. Leading entries the log
    /// already holds with the same ids (written by [`Self::append_if`]) are not written again;
    /// entries it holds at the indexes of the rest are replaced. Returns how many were written.
    fn append(&self, entries: &[(LogId, Vec<u8>)]) -> io::Result<usize>;

    /// Appends `entries` only if the log's vote is `vote`, a leader's, and the log ends at `prev`
    /// (see [`super::pre_append`]). Returns whether they were written.
    fn append_if(
        &self,
        vote: &Vote,
        prev: Option<LogId>,
        entries: &[(LogId, Vec<u8>)],
    ) -> io::Result<bool>;

    /// The id of the entry just before `index` (the purge point when that entry is purged).
    fn id_before(&self, index: u64) -> Option<LogId>;

    fn save_vote(&self, vote: &Vote) -> io::Result<()>;

    /// Notes the committed id, a hint for replay: it may ride on the next write.
    fn save_committed(&self, committed: Option<LogId>) -> io::Result<()>;

    /// Removes the entries from `from` on.
    fn truncate(&self, from: u64) -> io::Result<()>;

    /// Records the purge point and drops the entries up to it, as one write.
    fn purge(&self, to: LogId) -> io::Result<()>;

    /// Gives back the space of purged entries. Called only once the purge is durable.
    fn reclaim_purged(&self) -> io::Result<()>;

    fn vote(&self) -> Option<Vote>;

    fn committed(&self) -> Option<LogId>;

    /// (last purged, last) log ids; `last` falls back to the purge point when no entry is left.
    fn bounds(&self) -> (Option<LogId>, Option<LogId>);

    /// The entries in `range`, stopping before `byte_budget` would be exceeded (but with at least
    /// one entry when the range has one). An error names the index that could not be read.
    fn read(
        &self,
        range: (Bound<u64>, Bound<u64>),
        byte_budget: Option<usize>,
    ) -> Result<Vec<Entry>, (u64, String)>;
}

/// The durable half of an engine, owned by the flusher: one sync at a time.
pub(crate) trait LogSync: Send + 'static {
    /// Makes every write made before the call durable.
    fn sync(&mut self) -> io::Result<()>;
}

/// An engine opened on a Raft directory: the log, and what syncs it (for the flusher).
pub(crate) type OpenEngine = (Box<dyn LogEngine>, Box<dyn LogSync>);

/// The sled engine's database, inside the Raft directory: [`settle`] looks for it to tell a sled
/// log from a segment log, and `sled_log` opens its database there.
pub(crate) const SLED_DIR: &str = "sled";

const FILE_NAME: &str = "log-engine";
const MAGIC: &[u8; 8] = b"COORDENG";
const FORMAT_VERSION: u32 = 1;

/// Why [`settle`] refused.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The directory was made with this other engine.
    Other(RaftLogEngine),
    /// The record is unreadable, or the files contradict it.
    Damaged(String),
}

/// Makes sure the Raft directory `dir` is `requested`'s: records it in a directory that has no
/// engine yet, and refuses one made with the other engine. A directory written before engines
/// were selectable has segments (or a witness) and no record: it is a segment log.
pub(crate) fn settle(dir: &Path, requested: RaftLogEngine) -> Result<(), Refusal> {
    let path = dir.join(FILE_NAME);
    let stored = files::read_if_exists(&path)
        .map_err(|e| Refusal::Damaged(format!("{}: {e}", path.display())))?;
    let recorded = match &stored {
        Some(bytes) => {
            let body = files::unframe(MAGIC, FORMAT_VERSION, bytes)
                .map_err(|e| Refusal::Damaged(format!("{} is corrupt: {e}", path.display())))?;
            let name = String::from_utf8_lossy(body);
            Some(RaftLogEngine::from_name(&name).ok_or_else(|| {
                Refusal::Damaged(format!(
                    "{} names an unknown log engine {name:?}",
                    path.display()
                ))
            })?)
        }
        None => None,
    };
    let found = found_engines(dir).map_err(Refusal::Damaged)?;
    if found.len() > 1 || recorded.is_some_and(|r| found.iter().any(|f| *f != r)) {
        return Err(Refusal::Damaged(format!(
            "it holds files of both log engines (segments and sled){}",
            recorded.map_or(String::new(), |r| format!("; {} says {r}", path.display()))
        )));
    }
    // A witness without segments or a record: a segment log from before engines were recorded,
    // whose segments are gone (the witness check says so).
    let legacy = dir
        .join(super::witness::FILE_NAME)
        .exists()
        .then_some(RaftLogEngine::Segments);
    match recorded.or(found.first().copied()).or(legacy) {
        Some(engine) if engine != requested => Err(Refusal::Other(engine)),
        Some(_) if stored.is_some() => Ok(()),
        _ => files::write_atomically(
            dir,
            FILE_NAME,
            &files::frame(MAGIC, FORMAT_VERSION, requested.name().as_bytes()),
        )
        .map_err(|e| Refusal::Damaged(format!("cannot record the log engine: {e}"))),
    }
}

/// The engines whose files are in `dir`.
fn found_engines(dir: &Path) -> Result<Vec<RaftLogEngine>, String> {
    let segments = !segments::list(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .is_empty();
    let sled = dir.join(SLED_DIR).exists();
    Ok([
        (segments, RaftLogEngine::Segments),
        (sled, RaftLogEngine::Sled),
    ]
    .into_iter()
    .filter_map(|(there, e)| there.then_some(e))
    .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_keeps_its_engine() {
        let dir = tempfile::tempdir().expect("tempdir");
        settle(dir.path(), RaftLogEngine::Sled).expect("fresh");
        std::fs::create_dir(dir.path().join(SLED_DIR)).expect("sled dir");
        settle(dir.path(), RaftLogEngine::Sled).expect("same engine");
        assert!(matches!(
            settle(dir.path(), RaftLogEngine::Segments),
            Err(Refusal::Other(RaftLogEngine::Sled))
        ));
        // The record lost: the files still tell.
        std::fs::remove_file(dir.path().join(FILE_NAME)).expect("remove");
        assert!(matches!(
            settle(dir.path(), RaftLogEngine::Segments),
            Err(Refusal::Other(RaftLogEngine::Sled))
        ));
        // Damaged: refused, whichever engine is asked for.
        std::fs::write(dir.path().join(FILE_NAME), b"COORDENG garbage").expect("write");
        assert!(matches!(
            settle(dir.path(), RaftLogEngine::Sled),
            Err(Refusal::Damaged(_))
        ));
    }

    #[test]
    fn a_segment_log_from_before_the_record_is_a_segment_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(segments::file_name(1)), b"").expect("segment");
        assert!(matches!(
            settle(dir.path(), RaftLogEngine::Sled),
            Err(Refusal::Other(RaftLogEngine::Segments))
        ));
        settle(dir.path(), RaftLogEngine::Segments).expect("segments");
        assert!(dir.path().join(FILE_NAME).exists(), "recorded now");
        // Its witness alone (the segments lost) still says which engine it was.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(super::super::witness::FILE_NAME), b"").expect("witness");
        assert!(matches!(
            settle(dir.path(), RaftLogEngine::Sled),
            Err(Refusal::Other(RaftLogEngine::Segments))
        ));
        settle(dir.path(), RaftLogEngine::Segments).expect("segments");
        std::fs::write(dir.path().join(segments::file_name(1)), b"").expect("segment");
        // Files of both engines: refused.
        std::fs::create_dir(dir.path().join(SLED_DIR)).expect("sled dir");
        assert!(matches!(
            settle(dir.path(), RaftLogEngine::Segments),
            Err(Refusal::Damaged(_))
        ));
    }
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod conformance;

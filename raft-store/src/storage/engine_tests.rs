//! What every engine must do, run against each: what is written comes back after a reopen,
//! truncations and purges leave the log they should, the committed hint rides on the next write,
//! and pre-appends extend the log only as the leader's append would.

use std::ops::{Bound, RangeBounds};
use std::path::Path;

use openraft::{CommittedLeaderId, EntryPayload};

use super::*;
use crate::codec;
use crate::types::{Entry, LogId, Vote};

/// An engine open on a directory; dropping it closes it.
struct Open {
    log: Box<dyn LogEngine>,
    /// Held so that the engine is closed only when the test drops it (sled's sync shares its
    /// database).
    _sync: Box<dyn LogSync>,
}

impl std::ops::Deref for Open {
    type Target = dyn LogEngine;
    fn deref(&self) -> &Self::Target {
        &*self.log
    }
}

fn open(engine: RaftLogEngine, dir: &Path) -> Open {
    let (log, sync) = super::super::open_engine(dir, engine).expect("open");
    Open { log, _sync: sync }
}

fn id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn entries(term: u64, indexes: std::ops::Range<u64>) -> Vec<(LogId, Vec<u8>)> {
    indexes
        .map(|i| {
            let entry = Entry {
                log_id: id(term, i),
                payload: EntryPayload::Blank,
            };
            (
                entry.log_id,
                codec::encode("entry", &entry).expect("encode"),
            )
        })
        .collect()
}

fn read(log: &dyn LogEngine, range: impl RangeBounds<u64>, budget: Option<usize>) -> Vec<Entry> {
    let range: (Bound<u64>, Bound<u64>) =
        (range.start_bound().cloned(), range.end_bound().cloned());
    log.read(range, budget).expect("read")
}

/// (index, term) of every entry left.
fn contents(log: &dyn LogEngine) -> Vec<(u64, u64)> {
    read(log, .., None)
        .iter()
        .map(|e| (e.log_id.index, e.log_id.leader_id.term))
        .collect()
}

fn everything_written_comes_back_after_a_reopen(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let log = open(engine, dir.path());
        log.append(&entries(1, 0..10)).expect("append");
        log.save_vote(&Vote::new(2, 1)).expect("vote");
        log.truncate(7).expect("truncate");
        assert_eq!(log.bounds(), (None, Some(id(1, 6))));
        log.append(&entries(2, 7..12)).expect("append");
        log.save_committed(Some(id(2, 9))).expect("committed");
        log.purge(id(1, 3)).expect("purge");
        log.reclaim_purged().expect("reclaim");
        assert_eq!(read(&*log, 0..12, Some(1)).len(), 1);
        assert_eq!(read(&*log, 4..6, None).len(), 2);
        assert!(read(&*log, 6..6, None).is_empty());
    }
    let log = open(engine, dir.path());
    assert_eq!(log.bounds(), (Some(id(1, 3)), Some(id(2, 11))));
    let mut expected: Vec<(u64, u64)> = (4..7).map(|i| (i, 1)).collect();
    expected.extend((7..12).map(|i| (i, 2)));
    assert_eq!(contents(&*log), expected);
    assert_eq!(log.vote(), Some(Vote::new(2, 1)));
    assert_eq!(log.committed(), Some(id(2, 9)));
    assert!(read(&*log, 0..4, None).is_empty());

    log.append(&entries(2, 12..13))
        .expect("append after reopen");
    drop(log);
    let log = open(engine, dir.path());
    assert_eq!(log.bounds().1, Some(id(2, 12)));

    // Purged past the end: no entry left, the purge point stands for the last.
    log.purge(id(2, 12)).expect("purge all");
    assert_eq!(log.bounds(), (Some(id(2, 12)), Some(id(2, 12))));
    drop(log);
    let log = open(engine, dir.path());
    assert_eq!(log.bounds(), (Some(id(2, 12)), Some(id(2, 12))));
    assert!(contents(&*log).is_empty());
    log.append(&entries(3, 13..14))
        .expect("append after the purge");
    assert_eq!(contents(&*log), vec![(13, 3)]);
}

/// A committed id is written with the next write, not on its own: a reopen before that write
/// finds the hint written before it.
fn the_committed_hint_rides_on_the_next_write(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let log = open(engine, dir.path());
        log.append(&entries(1, 0..5)).expect("append");
        log.save_committed(Some(id(1, 2))).expect("committed");
        log.append(&entries(1, 5..6)).expect("append");
        log.save_committed(Some(id(1, 4))).expect("committed");
        assert_eq!(log.committed(), Some(id(1, 4)), "known at once in memory");
    }
    let log = open(engine, dir.path());
    assert_eq!(
        log.committed(),
        Some(id(1, 2)),
        "the later hint had no write to ride on"
    );
    assert_eq!(log.bounds().1, Some(id(1, 5)));
    log.save_committed(Some(id(1, 4))).expect("committed");
    log.save_vote(&Vote::new(2, 1)).expect("vote");
    drop(log);
    assert_eq!(open(engine, dir.path()).committed(), Some(id(1, 4)));
}

/// A pre-append (`append_if`) writes only when the log's vote is the sender's, a leader's, and
/// the log ends where the entries begin; otherwise nothing changes.
fn a_pre_append_extends_the_log_only_as_the_leaders_append_would(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(engine, dir.path());
    log.append(&entries(1, 1..4)).expect("append");
    let leader = Vote::new_committed(1, 1);
    log.save_vote(&leader).expect("vote");

    let refused = [
        (Vote::new(1, 1), Some(id(1, 3)), "a vote not yet a leader's"),
        (
            Vote::new_committed(2, 2),
            Some(id(1, 3)),
            "another leader's vote",
        ),
        (
            leader,
            Some(id(1, 2)),
            "entries that do not start at the log's end",
        ),
        (leader, Some(id(2, 3)), "a previous entry of another term"),
    ];
    for (vote, prev, what) in refused {
        let written = log
            .append_if(&vote, prev, &entries(1, 4..5))
            .expect("append_if");
        assert!(!written, "{what} was written");
        assert_eq!(log.bounds().1, Some(id(1, 3)), "{what} changed the log");
    }

    assert!(log
        .append_if(&leader, Some(id(1, 3)), &entries(1, 4..6))
        .expect("append_if"));
    assert_eq!(log.bounds().1, Some(id(1, 5)));
    drop(log);
    let log = open(engine, dir.path());
    assert_eq!(contents(&*log), (1..6).map(|i| (i, 1)).collect::<Vec<_>>());
}

/// openraft, which does not know of pre-appended entries, appends them again: the ones held
/// already are not written twice, and different ones at their indexes replace them.
fn an_append_skips_entries_held_and_replaces_others(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(engine, dir.path());
    log.append(&entries(1, 1..4)).expect("append");
    log.save_vote(&Vote::new_committed(1, 1)).expect("vote");
    assert!(log
        .append_if(
            &Vote::new_committed(1, 1),
            Some(id(1, 3)),
            &entries(1, 4..6)
        )
        .expect("append_if"));

    assert_eq!(
        log.append(&entries(1, 4..6)).expect("append"),
        0,
        "all held"
    );
    assert_eq!(log.append(&entries(1, 5..7)).expect("append"), 1, "one new");
    assert_eq!(contents(&*log), (1..7).map(|i| (i, 1)).collect::<Vec<_>>());

    // A new leader's entries from index 5 on replace the old term's 5 and 6.
    assert_eq!(log.append(&entries(2, 5..6)).expect("append"), 1);
    let expected = vec![(1, 1), (2, 1), (3, 1), (4, 1), (5, 2)];
    assert_eq!(contents(&*log), expected);
    drop(log);
    let log = open(engine, dir.path());
    assert_eq!(contents(&*log), expected, "the same after a reopen");
    assert_eq!(log.bounds().1, Some(id(2, 5)));
}

/// The id a pre-append names as its entries' predecessor: the entry before, or the purge point.
fn the_id_before_an_index_is_the_entry_or_the_purge_point(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = open(engine, dir.path());
    assert_eq!(log.id_before(0), None);
    log.append(&entries(1, 0..4)).expect("append");
    assert_eq!(log.id_before(3), Some(id(1, 2)));
    assert_eq!(log.id_before(4), Some(id(1, 3)));
    log.purge(id(1, 3)).expect("purge");
    assert_eq!(log.id_before(4), Some(id(1, 3)), "the purge point");
    assert_eq!(log.id_before(3), None, "purged and not the purge point");
    // A replaced entry is not the predecessor any more.
    log.append(&entries(2, 4..6)).expect("append");
    log.append(&entries(3, 5..6)).expect("append");
    assert_eq!(log.id_before(6), Some(id(3, 5)));
}

/// A sync succeeds on a fresh log and after writes of every kind.
fn a_sync_covers_every_kind_of_write(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (log, mut sync) = super::super::open_engine(dir.path(), engine).expect("open");
    sync.sync().expect("sync of nothing");
    log.append(&entries(1, 0..3)).expect("append");
    log.save_vote(&Vote::new(1, 1)).expect("vote");
    log.truncate(2).expect("truncate");
    log.purge(id(1, 0)).expect("purge");
    sync.sync().expect("sync");
    log.reclaim_purged().expect("reclaim");
    sync.sync().expect("sync after reclaiming");
}

/// One test per engine for each function above.
macro_rules! for_each_engine {
    ($($test:ident),* $(,)?) => {
        mod segments {
            $(#[test] fn $test() { super::$test(super::RaftLogEngine::Segments) })*
        }
        mod sled {
            $(#[test] fn $test() { super::$test(super::RaftLogEngine::Sled) })*
        }
    };
}

for_each_engine!(
    everything_written_comes_back_after_a_reopen,
    the_committed_hint_rides_on_the_next_write,
    a_pre_append_extends_the_log_only_as_the_leaders_append_would,
    an_append_skips_entries_held_and_replaces_others,
    the_id_before_an_index_is_the_entry_or_the_purge_point,
    a_sync_covers_every_kind_of_write,
);

//! The log files on their own: what is written comes back after a reopen, segments roll over and
//! are deleted once purged, a torn tail is cut, and damage anywhere else is refused.

use super::*;
use crate::storage::log_index::RECENT_ENTRIES;
use openraft::{CommittedLeaderId, EntryPayload};

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

/// (index, term) of every entry left.
fn contents(wal: &Wal) -> Vec<(u64, u64)> {
    wal.read(.., None)
        .expect("read")
        .iter()
        .map(|e| (e.log_id.index, e.log_id.leader_id.term))
        .collect()
}

fn open(dir: &Path, segment_bytes: u64) -> Wal {
    Wal::open_with(dir, segment_bytes).expect("open").0
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    segments::list(dir)
        .expect("list")
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

#[test]
fn everything_written_comes_back_after_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = open(dir.path(), 1 << 20);
        wal.append(&entries(1, 0..10)).expect("append");
        wal.save_vote(&Vote::new(2, 1)).expect("vote");
        wal.truncate(7).expect("truncate");
        wal.append(&entries(2, 7..12)).expect("append");
        wal.save_committed(Some(id(2, 9))).expect("committed");
        wal.purge(id(1, 3)).expect("purge");
        assert_eq!(wal.read(0..12, Some(1)).expect("read").len(), 1);
    }
    let wal = open(dir.path(), 1 << 20);
    assert_eq!(wal.bounds(), (Some(id(1, 3)), Some(id(2, 11))));
    let mut expected: Vec<(u64, u64)> = (4..7).map(|i| (i, 1)).collect();
    expected.extend((7..12).map(|i| (i, 2)));
    assert_eq!(contents(&wal), expected);
    assert_eq!(wal.vote(), Some(Vote::new(2, 1)));
    assert_eq!(wal.committed(), Some(id(2, 9)));
    assert!(wal.read(0..4, None).expect("read").is_empty());

    wal.append(&entries(2, 12..13))
        .expect("append after reopen");
    drop(wal);
    assert_eq!(open(dir.path(), 1 << 20).bounds().1, Some(id(2, 12)));
}

/// A committed id is written with the next record, not on its own: a reopen before that record
/// finds the hint written before it.
#[test]
fn the_committed_hint_rides_on_the_next_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = open(dir.path(), 1 << 20);
        wal.append(&entries(1, 0..5)).expect("append");
        wal.save_committed(Some(id(1, 2))).expect("committed");
        wal.append(&entries(1, 5..6)).expect("append");
        wal.save_committed(Some(id(1, 4))).expect("committed");
        assert_eq!(wal.committed(), Some(id(1, 4)), "known at once in memory");
    }
    let wal = open(dir.path(), 1 << 20);
    assert_eq!(
        wal.committed(),
        Some(id(1, 2)),
        "the later hint had no write to ride on"
    );
    assert_eq!(wal.bounds().1, Some(id(1, 5)));
    wal.save_committed(Some(id(1, 4))).expect("committed");
    wal.save_vote(&Vote::new(2, 1)).expect("vote");
    drop(wal);
    assert_eq!(open(dir.path(), 1 << 20).committed(), Some(id(1, 4)));
}

#[test]
fn full_segments_roll_over_and_purged_ones_go_without_losing_the_vote() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = open(dir.path(), 1024);
        // The vote is written once, into the first segment, which the purge below deletes.
        wal.save_vote(&Vote::new(5, 2)).expect("vote");
        for i in 0..200 {
            wal.append(&entries(5, i..i + 1)).expect("append");
        }
        let before = wal.segment_count();
        assert!(before > 5, "200 entries made only {before} segments");
        assert_eq!(segment_files(dir.path()).len(), before);
        wal.purge(id(5, 150)).expect("purge");
        let deleted = wal.delete_purged_segments().expect("delete");
        assert!(
            deleted > 0 && deleted < before,
            "deleted {deleted} of {before}"
        );
        assert_eq!(segment_files(dir.path()).len(), before - deleted);
        // Nothing unpurged went with them.
        assert_eq!(contents(&wal).len(), 49);
    }
    let wal = open(dir.path(), 1024);
    assert_eq!(wal.vote(), Some(Vote::new(5, 2)));
    assert_eq!(wal.bounds(), (Some(id(5, 150)), Some(id(5, 199))));
    assert_eq!(
        contents(&wal),
        (151..200).map(|i| (i, 5)).collect::<Vec<_>>()
    );
}

#[test]
fn a_torn_tail_is_cut_and_damage_elsewhere_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let wal = open(dir.path(), 1024);
        for i in 0..40 {
            wal.append(&entries(1, i..i + 1)).expect("append");
        }
    }
    let files = segment_files(dir.path());
    assert!(files.len() >= 2);
    let newest = files.last().expect("newest");
    let bytes = std::fs::read(newest).expect("read");
    // The data ends before the zeros the segment was filled with; the last record loses its end.
    let data_end = bytes.iter().rposition(|b| *b != 0).expect("data") + 1;
    std::fs::write(newest, &bytes[..data_end - 3]).expect("tear the last record");
    {
        let (wal, recovered) = Wal::open_with(dir.path(), 1024).expect("open after a torn write");
        assert!(recovered.torn_tail.is_some());
        assert_eq!(wal.bounds().1, Some(id(1, 38)));
        wal.append(&entries(2, 39..40))
            .expect("append over the torn tail");
    }
    let wal = open(dir.path(), 1024);
    assert_eq!(wal.bounds().1, Some(id(2, 39)));
    assert_eq!(contents(&wal).len(), 40);
    drop(wal);

    let oldest = &files[0];
    let mut bytes = std::fs::read(oldest).expect("read");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(oldest, &bytes).expect("damage an older segment");
    let err = Wal::open_with(dir.path(), 1024).err().expect("refused");
    assert!(
        err.contains(&oldest.display().to_string()),
        "the error does not name the file: {err}"
    );
}

#[test]
fn entries_out_of_order_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut bytes = Vec::new();
    for (log_id, encoded) in entries(1, 0..2).iter().chain(&entries(1, 3..4)) {
        segments::put_entry(&mut bytes, log_id, encoded);
    }
    std::fs::write(dir.path().join(segments::file_name(1)), &bytes).expect("write");
    let err = Wal::open_with(dir.path(), 1024).err().expect("refused");
    assert!(err.contains("expected entry 2"), "{err}");
}

/// Damaged logs of every shape (bytes flipped, cut, overwritten, garbage appended, a segment lost):
/// opening never panics, and a log that opens reads back as a contiguous run of entries ending
/// where its bounds say.
#[test]
fn fuzz_damaged_logs_never_panic_and_what_opens_is_consistent() {
    let mut next = coord_proto::fuzz::xorshift(0x005E_ED0F_10C5);
    let (mut opened, mut refused) = (0, 0);
    for round in 0..300u64 {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let wal = open(dir.path(), 512);
            wal.save_vote(&Vote::new(1 + round % 3, 1)).expect("vote");
            let n = 20 + next() % 40;
            for i in 0..n {
                wal.append(&entries(1, i..i + 1)).expect("append");
                if next().is_multiple_of(10) {
                    wal.save_committed(Some(id(1, i))).expect("committed");
                }
            }
            if next().is_multiple_of(2) {
                let to = next() % n;
                wal.truncate(to.max(1)).expect("truncate");
                wal.append(&entries(2, to.max(1)..to.max(1) + 3))
                    .expect("append");
            }
            if next().is_multiple_of(2) {
                wal.purge(id(1, next() % 10)).expect("purge");
                wal.delete_purged_segments().expect("delete");
            }
        }
        let files = segment_files(dir.path());
        let victim = &files[(next() as usize) % files.len()];
        let mut bytes = std::fs::read(victim).expect("read");
        let len = bytes.len().max(1);
        match next() % 6 {
            0 => {
                for _ in 0..1 + next() % 4 {
                    let at = (next() as usize) % len;
                    if let Some(b) = bytes.get_mut(at) {
                        *b ^= 1 << (next() % 8);
                    }
                }
            }
            1 => bytes.truncate((next() as usize) % len),
            2 => {
                let at = (next() as usize) % len;
                let end = (at + 1 + (next() as usize) % 64).min(bytes.len());
                for b in bytes.iter_mut().take(end).skip(at) {
                    *b = next() as u8;
                }
            }
            3 => bytes.extend((0..1 + next() % 100).map(|_| next() as u8)),
            4 => {
                // A record length claiming gigabytes.
                let at = (next() as usize) % len;
                let end = (at + 4).min(bytes.len());
                for b in bytes.iter_mut().take(end).skip(at) {
                    *b = 0xff;
                }
            }
            _ => bytes.clear(),
        }
        std::fs::write(victim, &bytes).expect("damage");
        if next().is_multiple_of(8) && files.len() > 2 {
            std::fs::remove_file(&files[1]).expect("lose a segment");
        }
        match Wal::open_with(dir.path(), 512) {
            Ok((wal, _)) => {
                opened += 1;
                let (purged, last) = wal.bounds();
                match wal.read(.., None) {
                    Ok(read) => {
                        for pair in read.windows(2) {
                            assert_eq!(
                                pair[0].log_id.index + 1,
                                pair[1].log_id.index,
                                "round {round}: a gap"
                            );
                        }
                        if let Some(e) = read.last() {
                            assert_eq!(Some(e.log_id), last, "round {round}");
                        }
                        if let (Some(p), Some(first)) = (purged, read.first()) {
                            assert_eq!(first.log_id.index, p.index + 1, "round {round}");
                        }
                    }
                    // A record damaged after open (not here) would be reported, not panic.
                    Err((index, why)) => panic!("round {round}: entry {index} unreadable: {why}"),
                }
            }
            Err(e) => {
                refused += 1;
                assert!(!e.is_empty());
            }
        }
    }
    // Both outcomes occurred, so the damage reached both the newest and the older segments.
    assert!(
        opened > 20 && refused > 20,
        "opened {opened}, refused {refused}"
    );
}

#[test]
fn a_crash_between_closing_a_segment_and_starting_the_next_is_recovered() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut last = 0;
    {
        let wal = open(dir.path(), 512);
        wal.save_vote(&Vote::new(4, 1)).expect("vote");
        while wal.segment_count() < 2 {
            wal.append(&entries(1, last..last + 1)).expect("append");
            last += 1;
        }
    }
    // The newest segment was created, but the crash came before anything in it reached disk.
    let files = segment_files(dir.path());
    std::fs::remove_file(files.last().expect("newest")).expect("remove");
    {
        let wal = open(dir.path(), 512);
        assert_eq!(wal.bounds().1, Some(id(1, last - 2)));
        assert_eq!(wal.vote(), Some(Vote::new(4, 1)));
        // The closed segment is not written again: a new one follows it.
        assert_eq!(segment_files(dir.path()).len(), 2);
        wal.append(&entries(2, last - 1..last)).expect("append");
    }
    let wal = open(dir.path(), 512);
    assert_eq!(wal.bounds().1, Some(id(2, last - 1)));
    assert_eq!(wal.vote(), Some(Vote::new(4, 1)));
    assert_eq!(contents(&wal).len() as u64, last);
}

#[test]
fn a_segment_never_closed_on_disk_drops_the_one_started_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut n = 0;
    {
        let wal = open(dir.path(), 512);
        wal.save_vote(&Vote::new(2, 1)).expect("vote");
        while wal.segment_count() < 3 {
            wal.append(&entries(1, n..n + 1)).expect("append");
            n += 1;
        }
    }
    // A power loss: the end record of the second-newest segment never reached the disk, though
    // the newest segment's file did.
    let files = segment_files(dir.path());
    let second = &files[files.len() - 2];
    let mut bytes = std::fs::read(second).expect("read");
    let data_end = bytes.iter().rposition(|b| *b != 0).expect("data") + 1;
    let end_record = segments::RECORD_HEADER + 1;
    bytes[data_end - end_record..data_end].fill(0);
    std::fs::write(second, &bytes).expect("lose the end record");
    {
        let wal = open(dir.path(), 512);
        assert_eq!(
            segment_files(dir.path()).len(),
            files.len() - 1,
            "newest dropped"
        );
        // The entry that had gone to the newest segment is gone; everything before it is there.
        assert_eq!(wal.bounds().1, Some(id(1, n - 2)));
        assert_eq!(wal.vote(), Some(Vote::new(2, 1)));
        wal.append(&entries(3, n - 1..n)).expect("append");
    }
    let wal = open(dir.path(), 512);
    assert_eq!(wal.bounds().1, Some(id(3, n - 1)));
    assert_eq!(contents(&wal).len() as u64, n);

    // Two segments without an end record is damage, not a crash in between.
    drop(wal);
    let files = segment_files(dir.path());
    let first = &files[0];
    let mut bytes = std::fs::read(first).expect("read");
    let data_end = bytes.iter().rposition(|b| *b != 0).expect("data") + 1;
    bytes[data_end - end_record..data_end].fill(0);
    std::fs::write(first, &bytes).expect("lose another end record");
    let err = Wal::open_with(dir.path(), 512).err().expect("refused");
    assert!(err.contains("no end record"), "{err}");
}

/// The newest entries are read back from memory (so replication and apply do not go to the file
/// for an entry just written), older ones from the file, and a truncated entry's record is never
/// served in place of the one appended after it.
#[test]
fn recent_entries_are_served_from_memory_and_truncation_is_respected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = open(dir.path(), 1 << 20);
    for i in 0..100 {
        wal.append(&entries(1, i..i + 1)).expect("append");
    }
    // Zero every segment file: what still reads back came from memory.
    for path in segment_files(dir.path()) {
        let len = std::fs::metadata(&path).expect("stat").len();
        std::fs::write(&path, vec![0u8; len as usize]).expect("zero");
    }
    let first_recent = 100 - RECENT_ENTRIES as u64;
    let recent = wal.read(first_recent..100, None).expect("recent entries");
    assert_eq!(recent.len(), RECENT_ENTRIES);
    assert!(
        wal.read(first_recent - 1..first_recent, None).is_err(),
        "an older entry is read from the (zeroed) file"
    );

    wal.truncate(90).expect("truncate");
    wal.append(&entries(2, 90..95)).expect("append");
    let got: Vec<(u64, u64)> = wal
        .read(85..95, None)
        .expect("read")
        .iter()
        .map(|e| (e.log_id.index, e.log_id.leader_id.term))
        .collect();
    let want: Vec<(u64, u64)> = (85..95).map(|i| (i, if i < 90 { 1 } else { 2 })).collect();
    assert_eq!(got, want);
}

/// A pre-append (`append_if`) writes only when the log's vote is the sender's, a leader's, and
/// the log ends where the entries begin; otherwise nothing changes.
#[test]
fn a_pre_append_extends_the_log_only_as_the_leaders_append_would() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = open(dir.path(), 1 << 20);
    wal.append(&entries(1, 1..4)).expect("append");
    let leader = Vote::new_committed(1, 1);
    wal.save_vote(&leader).expect("vote");

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
        let written = wal
            .append_if(&vote, prev, &entries(1, 4..5))
            .expect("append_if");
        assert!(!written, "{what} was written");
        assert_eq!(wal.bounds().1, Some(id(1, 3)), "{what} changed the log");
    }

    assert!(wal
        .append_if(&leader, Some(id(1, 3)), &entries(1, 4..6))
        .expect("append_if"));
    assert_eq!(wal.bounds().1, Some(id(1, 5)));
    drop(wal);
    let wal = open(dir.path(), 1 << 20);
    assert_eq!(contents(&wal), (1..6).map(|i| (i, 1)).collect::<Vec<_>>());
}

/// openraft, which does not know of pre-appended entries, appends them again: the ones held
/// already are not written twice, and different ones at their indexes replace them.
#[test]
fn an_append_skips_entries_held_and_replaces_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = open(dir.path(), 1 << 20);
    wal.append(&entries(1, 1..4)).expect("append");
    wal.save_vote(&Vote::new_committed(1, 1)).expect("vote");
    assert!(wal
        .append_if(
            &Vote::new_committed(1, 1),
            Some(id(1, 3)),
            &entries(1, 4..6)
        )
        .expect("append_if"));

    assert_eq!(
        wal.append(&entries(1, 4..6)).expect("append"),
        0,
        "all held"
    );
    assert_eq!(wal.append(&entries(1, 5..7)).expect("append"), 1, "one new");
    assert_eq!(contents(&wal), (1..7).map(|i| (i, 1)).collect::<Vec<_>>());

    // A new leader's entries from index 5 on replace the old term's 5 and 6.
    assert_eq!(wal.append(&entries(2, 5..6)).expect("append"), 1);
    let expected = vec![(1, 1), (2, 1), (3, 1), (4, 1), (5, 2)];
    assert_eq!(contents(&wal), expected);
    drop(wal);
    let wal = open(dir.path(), 1 << 20);
    assert_eq!(contents(&wal), expected, "the same after a reopen");
    assert_eq!(wal.bounds().1, Some(id(2, 5)));
}

/// The id a pre-append names as its entries' predecessor: the entry before, or the purge point.
#[test]
fn the_id_before_an_index_is_the_entry_or_the_purge_point() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wal = open(dir.path(), 1 << 20);
    assert_eq!(wal.id_before(0), None);
    wal.append(&entries(1, 0..4)).expect("append");
    assert_eq!(wal.id_before(3), Some(id(1, 2)));
    assert_eq!(wal.id_before(4), Some(id(1, 3)));
    wal.purge(id(1, 3)).expect("purge");
    assert_eq!(wal.id_before(4), Some(id(1, 3)), "the purge point");
    assert_eq!(wal.id_before(3), None, "purged and not the purge point");
    // A replaced entry is not the predecessor any more.
    wal.append(&entries(2, 4..6)).expect("append");
    wal.append(&entries(3, 5..6)).expect("append");
    assert_eq!(wal.id_before(6), Some(id(3, 5)));
}

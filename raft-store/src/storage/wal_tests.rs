//! The segment files on their own (what every engine must do is in `engine_tests.rs`): segments
//! roll over and are deleted once purged, a torn tail is cut, and damage anywhere else is refused.

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

//! The sled engine on its own: large values in sled's blob files come back, what its sync covers,
//! and damaged files are refused or read as a log that is whole up to where it ends.

use super::*;
use crate::storage::engine::SLED_DIR;
use openraft::{CommittedLeaderId, EntryPayload};

fn id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// Entries whose payload is a membership-free blank, padded by `pad` bytes of a normal entry.
fn entries(term: u64, indexes: std::ops::Range<u64>, pad: usize) -> Vec<(LogId, Vec<u8>)> {
    indexes
        .map(|i| {
            let entry = Entry {
                log_id: id(term, i),
                payload: if pad == 0 {
                    EntryPayload::Blank
                } else {
                    EntryPayload::Normal(crate::Proposal::new(
                        i,
                        vec![crate::Command {
                            request: None,
                            op: crate::Op::KvPut {
                                key: format!("k{i}"),
                                value: bytes::Bytes::from(vec![b'v'; pad]),
                                overwrite: true,
                            },
                        }],
                    ))
                },
            };
            (
                entry.log_id,
                codec::encode("entry", &entry).expect("encode"),
            )
        })
        .collect()
}

fn all(log: &SledLog) -> Result<Vec<Entry>, (u64, String)> {
    log.read((Bound::Unbounded, Bound::Unbounded), None)
}

#[test]
fn large_entries_live_in_blobs_that_a_sync_covers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(SLED_DIR);
    {
        let (log, mut sync) = SledLog::open(&path).expect("open");
        // Over sled's inline limit (a quarter of its 512 KiB segments).
        log.append(&entries(1, 0..3, 300 << 10)).expect("append");
        sync.sync().expect("sync");
        assert!(
            !sync.synced_blobs.is_empty(),
            "no blob file was written for 300 KiB entries"
        );
        assert!(log.size_on_disk() > 0);
    }
    let (log, _sync) = SledLog::open(&path).expect("reopen");
    let read = all(&log).expect("read");
    assert_eq!(
        read.iter().map(|e| e.log_id).collect::<Vec<_>>(),
        vec![id(1, 0), id(1, 1), id(1, 2)]
    );
}

#[test]
fn a_gap_in_the_entries_is_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(SLED_DIR);
    {
        let (log, _sync) = SledLog::open(&path).expect("open");
        log.append(&entries(1, 0..5, 0)).expect("append");
        // What no write of the engine does: an entry goes missing in the middle.
        log.db.remove(entry_key(2)).expect("remove");
    }
    let err = SledLog::open(&path).err().expect("a gap is refused");
    assert!(err.contains("entries are missing"), "{err}");
}

#[test]
fn an_entry_stored_under_the_wrong_index_is_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(SLED_DIR);
    {
        let (log, _sync) = SledLog::open(&path).expect("open");
        log.append(&entries(1, 0..3, 0)).expect("append");
        let two = log.db.get(entry_key(2)).expect("get").expect("entry 2");
        log.db.insert(entry_key(1), two).expect("insert");
    }
    let err = SledLog::open(&path).err().expect("refused");
    assert!(err.contains("entry 1 says it is entry 2"), "{err}");
}

/// Damage to sled's files, anywhere: opening never panics, and what opens is a log whose entries
/// follow one another from its purge point and decode (whether entries at its end are missing is
/// the witness's to say; see the storage tests).
#[test]
fn fuzz_damaged_sled_files_never_panic_and_what_opens_is_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pristine = dir.path().join("pristine");
    {
        let (log, mut sync) = SledLog::open(&pristine).expect("open");
        log.save_vote(&Vote::new(3, 1)).expect("vote");
        for i in 0..40 {
            log.append(&entries(3, i * 10..i * 10 + 10, 200))
                .expect("append");
            sync.sync().expect("sync");
        }
        log.purge(id(3, 99)).expect("purge");
        sync.sync().expect("sync");
    }
    let files: Vec<_> = std::fs::read_dir(&pristine)
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != "blobs")
        .collect();
    assert!(files.iter().any(|n| n == "db"), "{files:?}");
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut refused, mut opened) = (0, 0);
    for round in 0..40 {
        let case = dir.path().join(format!("case{round}"));
        std::fs::create_dir_all(case.join("blobs")).expect("mkdir");
        for name in &files {
            std::fs::copy(pristine.join(name), case.join(name)).expect("copy");
        }
        let victim = case.join(&files[next() as usize % files.len()]);
        let mut bytes = std::fs::read(&victim).expect("read");
        if bytes.is_empty() {
            continue;
        }
        match next() % 3 {
            0 => bytes.truncate(next() as usize % bytes.len()),
            1 => {
                for _ in 0..1 + next() % 8 {
                    let at = next() as usize % bytes.len();
                    bytes[at] ^= 1 << (next() % 8);
                }
            }
            _ => {
                let at = next() as usize % bytes.len();
                let end = (at + 1 + next() as usize % 4096).min(bytes.len());
                bytes[at..end].fill(0xA5);
            }
        }
        std::fs::write(&victim, &bytes).expect("damage");
        let result = std::panic::catch_unwind(|| match SledLog::open(&case) {
            Ok((log, _sync)) => {
                let (purged, last) = log.bounds();
                let read = all(&log).map_err(|(i, e)| format!("entry {i}: {e}"))?;
                let first = purged.map_or(0, |p| p.index + 1);
                for (i, e) in read.iter().enumerate() {
                    if e.log_id.index != first + i as u64 {
                        return Err(format!("entry {} at position {i}", e.log_id.index));
                    }
                }
                if read.last().map(|e| e.log_id).or(purged) != last {
                    return Err(format!("bounds {last:?} disagree with the entries"));
                }
                Ok(true)
            }
            Err(_) => Ok(false),
        });
        match result {
            Ok(Ok(true)) => opened += 1,
            Ok(Ok(false)) => refused += 1,
            Ok(Err(e)) => panic!(
                "round {round}: damage to {} opened inconsistent: {e}",
                victim.display()
            ),
            Err(_) => panic!(
                "round {round}: damage to {} made sled panic",
                victim.display()
            ),
        }
    }
    assert!(refused + opened > 30, "{refused} refused, {opened} opened");
}

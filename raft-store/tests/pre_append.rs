//! A follower's side of a leader's pre-append, through the log store's public surface.

#[macro_use]
mod common;

use coord_raft_store::codec;
use coord_raft_store::storage::pre_append::PreAppend;
use coord_raft_store::storage::{RaftLogEngine, StoreOptions};
use coord_raft_store::types::{Entry, LogId, Vote};
use openraft::storage::RaftLogStorage;
use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader};

fn id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn encoded(term: u64, index: u64) -> (LogId, Vec<u8>) {
    let entry = Entry {
        log_id: id(term, index),
        payload: EntryPayload::Blank,
    };
    (
        entry.log_id,
        codec::encode("entry", &entry).expect("encode"),
    )
}

async fn a_pre_append_is_written_durably_and_bad_ones_are_refused(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = StoreOptions {
        log_engine: engine,
        ..StoreOptions::default()
    };
    let (mut log, _sm) = common::open_store(dir.path(), options.clone());
    let leader = Vote::new_committed(1, 1);
    log.save_vote(&leader).await.expect("vote");

    // Bytes that are not the entry announced change nothing.
    // An empty log's first entry has index 0.
    let mut wrong = encoded(1, 0);
    wrong.0 = id(1, 1);
    let refused = log
        .pre_append(PreAppend {
            vote: leader,
            prev: None,
            entries: vec![wrong],
        })
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let gap = log
        .pre_append(PreAppend {
            vote: leader,
            prev: None,
            entries: vec![encoded(1, 0), encoded(1, 2)],
        })
        .await;
    assert!(gap.is_err(), "entries with a gap: {gap:?}");
    assert_eq!(log.get_log_state().await.expect("state").last_log_id, None);

    let written = log
        .pre_append(PreAppend {
            vote: leader,
            prev: None,
            entries: vec![encoded(1, 0), encoded(1, 1)],
        })
        .await
        .expect("pre-append");
    assert!(written);
    // Another leader's does not extend it.
    let other = log
        .pre_append(PreAppend {
            vote: Vote::new_committed(2, 3),
            prev: Some(id(1, 1)),
            entries: vec![encoded(2, 2)],
        })
        .await
        .expect("pre-append");
    assert!(!other);
    let stats = log.sync_stats();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(count(&stats.pre_appends_written), 1);
    assert_eq!(count(&stats.pre_appends_passed), 1);
    drop(log);
    drop(_sm);

    let (mut log, _sm) = common::open_store(dir.path(), options);
    assert_eq!(
        log.get_log_state().await.expect("state").last_log_id,
        Some(id(1, 1))
    );
    let read = log.try_get_log_entries(0..3).await.expect("read");
    assert_eq!(
        read.iter().map(|e| e.log_id).collect::<Vec<_>>(),
        vec![id(1, 0), id(1, 1)]
    );
}

for_each_engine_async!(a_pre_append_is_written_durably_and_bad_ones_are_refused);

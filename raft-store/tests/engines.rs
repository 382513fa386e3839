//! The log engines at the storage's door: a data directory keeps the engine it was made with, and
//! damage to sled's files that loses acknowledged entries is refused at open, as with segments.

#[macro_use]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use coord_raft_store::storage::{self, OpenError, RaftLogEngine, StoreOptions};
use coord_raft_store::types::{Raft, Vote};
use coord_raft_store::{Command, Op, Proposal, RequestId};
use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Config};

fn options(engine: RaftLogEngine) -> StoreOptions {
    StoreOptions {
        log_engine: engine,
        ..StoreOptions::default()
    }
}

fn open(dir: &Path, engine: RaftLogEngine) -> Result<storage::Opened, OpenError> {
    storage::open(dir, options(engine), Arc::new(common::NoListener))
}

fn other(engine: RaftLogEngine) -> RaftLogEngine {
    match engine {
        RaftLogEngine::Segments => RaftLogEngine::Sled,
        RaftLogEngine::Sled => RaftLogEngine::Segments,
    }
}

async fn a_data_dir_keeps_its_engine(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = open(dir.path(), engine).expect("open").log;
        log.save_vote(&Vote::new(4, 2)).await.expect("vote");
    }
    let refused = open(dir.path(), other(engine)).err().expect("refused");
    let message = refused.to_string();
    assert!(
        matches!(refused, OpenError::OtherEngine { .. }),
        "{message}"
    );
    for needle in [
        format!("made with the {engine} engine"),
        format!("started with --raft-log {}", other(engine)),
        format!("start it with --raft-log {engine}"),
    ] {
        assert!(message.contains(&needle), "{needle:?} not in: {message}");
    }
    // The refusal changed nothing.
    let mut log = open(dir.path(), engine).expect("reopen").log;
    assert_eq!(
        log.read_vote().await.expect("read vote"),
        Some(Vote::new(4, 2))
    );
}

fn put(seq: u64) -> Proposal {
    Proposal::new(
        seq,
        vec![Command {
            request: Some(RequestId {
                client: 1,
                seq,
                acked_below: 1,
            }),
            op: Op::KvPut {
                key: format!("k{seq}"),
                value: Bytes::from(vec![b'v'; 2048]),
                overwrite: false,
            },
        }],
    )
}

/// Writes through a one-replica Raft on `engine` in two rounds more than the witness interval
/// apart, so that the witness holds a committed index well into the log; returns it closed.
async fn write_witnessed_log(dir: &Path, engine: RaftLogEngine) {
    let opened = open(dir, engine).expect("open");
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..Config::default()
    }
    .validate()
    .expect("config");
    let raft = Raft::new(
        1,
        Arc::new(config),
        common::NoPeers,
        opened.log,
        opened.state_machine,
    )
    .await
    .expect("raft");
    raft.initialize(std::collections::BTreeMap::from([(1, BasicNode::new("x"))]))
        .await
        .expect("initialize");
    raft.wait(Some(Duration::from_secs(20)))
        .current_leader(1, "leader")
        .await
        .expect("becomes leader");
    for round in 0..2u64 {
        for i in 0..150 {
            raft.client_write(put(round * 1000 + i + 1))
                .await
                .expect("write");
        }
        tokio::time::sleep(storage::witness::COMMIT_WITNESS_INTERVAL + Duration::from_millis(100))
            .await;
    }
    // One more sync past the interval: the witness now holds (nearly) all of it.
    raft.client_write(put(5000)).await.expect("write");
    raft.shutdown().await.expect("shutdown");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("list") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// Damage to the sled engine's files, each on a copy of a data directory whose witness holds a
/// committed index: never opened as a log without the entries acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_to_sled_files_that_loses_acknowledged_entries_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let pristine = root.path().join("pristine");
    write_witnessed_log(&pristine, RaftLogEngine::Sled).await;
    // Undamaged, it opens with everything.
    {
        let mut opened = open(&pristine, RaftLogEngine::Sled).expect("undamaged opens");
        let state = opened.log.get_log_state().await.expect("state");
        assert!(
            state.last_log_id.is_some_and(|l| l.index > 300),
            "{state:?}"
        );
    }
    let db = Path::new("raft/sled/db");
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        (
            "sled's log file cut to a third",
            Box::new(move |dir| {
                let path = dir.join(db);
                let len = std::fs::metadata(&path).expect("db").len();
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .expect("open db");
                file.set_len(len / 3).expect("truncate");
            }),
        ),
        (
            "sled's log file emptied",
            Box::new(move |dir| std::fs::write(dir.join(db), b"").expect("empty")),
        ),
        (
            "sled's log file overwritten with garbage",
            Box::new(move |dir| {
                let path = dir.join(db);
                let len = std::fs::metadata(&path).expect("db").len() as usize;
                std::fs::write(&path, vec![0xA5u8; len]).expect("scribble");
            }),
        ),
        (
            "sled's configuration garbled",
            Box::new(|dir| {
                std::fs::write(dir.join("raft/sled/conf"), b"segment_size: x\n1234").expect("conf")
            }),
        ),
        (
            "sled's directory deleted",
            Box::new(|dir| std::fs::remove_dir_all(dir.join("raft/sled")).expect("rm")),
        ),
        (
            "the engine record garbled",
            Box::new(|dir| std::fs::write(dir.join("raft/log-engine"), b"COORDENG").expect("w")),
        ),
    ];
    for (i, (what, damage)) in cases.iter().enumerate() {
        let case = root.path().join(format!("case{i}"));
        copy_dir(&pristine, &case);
        damage(&case);
        match open(&case, RaftLogEngine::Sled) {
            Ok(mut opened) => {
                let state = opened.log.get_log_state().await.expect("state");
                panic!("{what}: opened, log state {state:?}");
            }
            Err(e) => {
                let message = e.to_string();
                assert!(
                    matches!(e, OpenError::Damaged { .. }),
                    "{what}: refused, but not as damage: {message}"
                );
                eprintln!("{what}: {message}");
            }
        }
    }
}

for_each_engine_async!(a_data_dir_keeps_its_engine);

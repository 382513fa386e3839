//! No write is acknowledged before its sync: a real one-replica openraft runs on the real store,
//! on each log engine, and a sync hook holds back or fails the flusher's syncs.

#[macro_use]
mod common;

use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coord_raft_store::storage::{RaftLogEngine, StoreOptions, SyncHook};
use coord_raft_store::types::{Raft, Vote};
use coord_raft_store::{Command, Op, Proposal, RequestId};
use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, Config};

/// A gate in front of every sync: while closed, syncs wait; `fail` makes them report an error.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Default)]
struct GateState {
    closed: bool,
    fail: bool,
    /// Syncs currently held at the gate.
    waiting: usize,
    /// Syncs that went through (successfully or not).
    passed: usize,
}

impl Gate {
    fn set(&self, f: impl FnOnce(&mut GateState)) {
        let mut s = self.state.lock().expect("gate lock");
        f(&mut s);
        self.changed.notify_all();
    }

    fn get<R>(&self, f: impl FnOnce(&GateState) -> R) -> R {
        f(&self.state.lock().expect("gate lock"))
    }

    /// Waits (with a deadline) until a sync is held at the closed gate.
    async fn wait_for_held_sync(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.get(|s| s.waiting) == 0 {
            assert!(Instant::now() < deadline, "no sync reached the gate");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl SyncHook for Gate {
    fn before_sync(&self) -> io::Result<()> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| io::Error::other("gate poisoned"))?;
        s.waiting += 1;
        self.changed.notify_all();
        while s.closed {
            s = self
                .changed
                .wait(s)
                .map_err(|_| io::Error::other("gate poisoned"))?;
        }
        s.waiting -= 1;
        s.passed += 1;
        if s.fail {
            return Err(io::Error::other("injected sync failure"));
        }
        Ok(())
    }
}

fn put(seq: u64, key: &str) -> Proposal {
    Proposal::new(
        seq,
        vec![Command {
            request: Some(RequestId {
                client: 1,
                seq,
                acked_below: 1,
            }),
            op: Op::KvPut {
                key: key.into(),
                value: Bytes::from_static(b"v"),
                overwrite: false,
            },
        }],
    )
}

fn gated(engine: RaftLogEngine, gate: &Arc<Gate>) -> StoreOptions {
    StoreOptions {
        log_engine: engine,
        sync_hook: Some(gate.clone()),
    }
}

async fn start_single(
    engine: RaftLogEngine,
    dir: &std::path::Path,
    gate: &Arc<Gate>,
    init: bool,
) -> (Raft, coord_raft_store::storage::StateReader) {
    let options = gated(engine, gate);
    let (log, sm) = common::open_store(dir, options);
    let reader = sm.reader();
    let config = Config {
        heartbeat_interval: 50,
        election_timeout_min: 150,
        election_timeout_max: 300,
        ..Config::default()
    }
    .validate()
    .expect("config");
    let raft = Raft::new(1, Arc::new(config), common::NoPeers, log, sm)
        .await
        .expect("raft");
    if init {
        raft.initialize(std::collections::BTreeMap::from([(1, BasicNode::new("x"))]))
            .await
            .expect("initialize");
    }
    raft.wait(Some(Duration::from_secs(20)))
        .current_leader(1, "leader")
        .await
        .expect("becomes leader");
    (raft, reader)
}

fn has_key(reader: &coord_raft_store::storage::StateReader, key: &str) -> bool {
    reader.read(|a| a.state.kv.get(key).is_some())
}

async fn a_write_is_acknowledged_only_after_its_sync(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = Arc::new(Gate::default());
    let (raft, reader) = start_single(engine, dir.path(), &gate, true).await;

    gate.set(|s| s.closed = true);
    let writer = {
        let raft = raft.clone();
        tokio::spawn(async move { raft.client_write(put(1, "held")).await })
    };
    gate.wait_for_held_sync().await;
    // The entry is appended and the sync that covers it is held: nothing may be acknowledged,
    // and (one replica, so commit needs the local sync) nothing applied.
    tokio::task::yield_now().await;
    assert!(
        !writer.is_finished(),
        "write acknowledged while its sync was held"
    );
    assert!(
        !has_key(&reader, "held"),
        "write applied before it was durable"
    );

    gate.set(|s| s.closed = false);
    let resp = tokio::time::timeout(Duration::from_secs(20), writer)
        .await
        .expect("write completes once the sync passes")
        .expect("join")
        .expect("write ok");
    assert_eq!(resp.data.len(), 1);
    assert!(has_key(&reader, "held"));
    raft.shutdown().await.expect("shutdown");
}

async fn a_failed_sync_is_never_acknowledged(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = Arc::new(Gate::default());
    let (raft, reader) = start_single(engine, dir.path(), &gate, true).await;

    gate.set(|s| s.fail = true);
    let result =
        tokio::time::timeout(Duration::from_secs(20), raft.client_write(put(1, "lost"))).await;
    // Either the write fails or it never completes; it must not succeed.
    assert!(
        !matches!(result, Ok(Ok(_))),
        "a write whose sync failed was acknowledged"
    );
    assert!(!has_key(&reader, "lost"));
    let _ = raft.shutdown().await;
}

/// openraft 0.9 waits for each append's flush before the next, so Raft-level grouping comes from
/// the server packing many client writes into one entry; the flusher itself must still fold
/// every writer queued behind a sync into the next one.
async fn writers_queued_behind_a_sync_share_the_next_one(engine: RaftLogEngine) {
    // Votes are the durable writes outside openraft's one-at-a-time append path.
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = Arc::new(Gate::default());
    let options = gated(engine, &gate);
    let (log, _sm) = common::open_store(dir.path(), options);
    gate.set(|s| s.closed = true);
    let first = {
        let mut log = log.clone();
        tokio::spawn(async move { log.save_vote(&Vote::new(1, 1)).await })
    };
    gate.wait_for_held_sync().await;
    let n = 100u64;
    let writers: Vec<_> = (0..n)
        .map(|i| {
            let mut log = log.clone();
            tokio::spawn(async move { log.save_vote(&Vote::new(2 + i, 1)).await })
        })
        .collect();
    // Wait (with a deadline) until every writer is queued behind the held sync.
    let stats = log.sync_stats();
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.submitted.load(std::sync::atomic::Ordering::Relaxed) < 1 + n {
        assert!(Instant::now() < deadline, "writers did not queue up");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let before = gate.get(|s| s.passed);
    gate.set(|s| s.closed = false);
    first.await.expect("join").expect("first write");
    for w in writers {
        w.await.expect("join").expect("write");
    }
    let syncs = gate.get(|s| s.passed) - before;
    assert!(
        (syncs as u64) * 4 < n,
        "{n} queued writers took {syncs} syncs: the flusher does not group"
    );
    let mut log = log;
    assert!(log
        .read_vote()
        .await
        .expect("read vote")
        .is_some_and(|v| v.leader_id.term >= 2));
}

async fn save_vote_returns_only_when_durable(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = Arc::new(Gate::default());
    let options = gated(engine, &gate);
    let (log, _sm) = common::open_store(dir.path(), options.clone());
    gate.set(|s| s.closed = true);
    let vote = Vote::new(7, 3);
    let saver = {
        let mut log = log.clone();
        tokio::spawn(async move { log.save_vote(&vote).await })
    };
    gate.wait_for_held_sync().await;
    assert!(!saver.is_finished(), "save_vote returned before its sync");
    gate.set(|s| s.closed = false);
    saver.await.expect("join").expect("save_vote");
    drop(log);
    drop(_sm);

    let (mut log, _sm) = common::open_store(dir.path(), options);
    assert_eq!(log.read_vote().await.expect("read_vote"), Some(vote));
}

async fn committed_writes_survive_a_restart(engine: RaftLogEngine) {
    let dir = tempfile::tempdir().expect("tempdir");
    let gate = Arc::new(Gate::default());
    {
        let (raft, _reader) = start_single(engine, dir.path(), &gate, true).await;
        for i in 0..50u64 {
            raft.client_write(put(i + 1, &format!("r{i}")))
                .await
                .expect("write");
        }
        raft.shutdown().await.expect("shutdown");
    }
    let (raft, reader) = start_single(engine, dir.path(), &gate, false).await;
    // Replay of the committed log rebuilds the in-memory state.
    raft.wait(Some(Duration::from_secs(20)))
        .applied_index_at_least(Some(51), "replayed")
        .await
        .expect("replay");
    for i in 0..50 {
        assert!(
            has_key(&reader, &format!("r{i}")),
            "r{i} lost across restart"
        );
    }
    raft.shutdown().await.expect("shutdown");
}

for_each_engine_async!(
    a_write_is_acknowledged_only_after_its_sync,
    a_failed_sync_is_never_acknowledged,
    writers_queued_behind_a_sync_share_the_next_one,
    save_vote_returns_only_when_durable,
    committed_writes_survive_a_restart,
);

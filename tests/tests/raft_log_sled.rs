//! An ensemble on the sled log engine (`--raft-log sled`), end to end: writes under load survive
//! a kill -9 of the leader and a kill -9 of every replica, and a data directory refuses the other
//! engine and damage to sled's files.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_tests::cluster::wait_for_count;
use coord_tests::{Cluster, ClusterOptions};

const TIMEOUT: Duration = Duration::from_secs(60);

fn client_of(c: &Cluster) -> CoordClient {
    CoordClient::new(ClientOptions::new(c.endpoints())).expect("client")
}

fn with_engine(args: &[String], engine: &str) -> Vec<String> {
    let mut out = args.to_vec();
    let i = out
        .iter()
        .position(|a| a == "--raft-log")
        .expect("--raft-log in the replica's flags");
    out[i + 1] = engine.to_string();
    out
}

/// Every acknowledged key is there with its value.
async fn assert_all_present(client: &CoordClient, acked: &BTreeMap<String, Bytes>, when: &str) {
    let mut found = BTreeMap::new();
    for (k, v) in client.get_dir("load").await.expect("get_dir") {
        found.insert(k, v);
    }
    for (k, v) in client.get_dir("big").await.expect("get_dir") {
        found.insert(k, v);
    }
    let missing: Vec<_> = acked
        .iter()
        .filter(|(k, v)| found.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    assert!(
        missing.is_empty(),
        "{when}: {} acknowledged writes lost or changed, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_ensemble_keeps_every_acknowledged_write_and_its_engine() {
    let mut c = Cluster::start(ClusterOptions {
        extra_args: vec!["--raft-log".into(), "sled".into()],
        ..ClusterOptions::default()
    });
    let leader = c.wait_for_leader(TIMEOUT).await;
    for id in c.ids() {
        let raft = c.replica(id).data_dir.join("raft");
        assert!(
            raft.join("sled/db").exists(),
            "no sled log in {}",
            raft.display()
        );
        assert!(
            !raft.read_dir().expect("raft dir").any(|e| e
                .expect("entry")
                .path()
                .extension()
                .is_some_and(|x| x == "seg")),
            "segment files in {}",
            raft.display()
        );
    }
    let client = client_of(&c);
    client.find_leader().await;

    // Values past sled's inline limit go to its blob files, which coord syncs itself.
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    for i in 0..4 {
        let key = format!("big/{i}");
        let value = Bytes::from(vec![b'0' + i as u8; 200 << 10]);
        client
            .insert(&key, value.clone(), false)
            .await
            .expect("big");
        acked.lock().expect("lock").insert(key, value);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (client, acked, stop, count) =
                (client.clone(), acked.clone(), stop.clone(), count.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("load/{w}/{i}");
                    let value = Bytes::from(format!("{w}-{i}"));
                    match client.insert(&key, value.clone(), false).await {
                        Ok(()) => {
                            acked.lock().expect("lock").insert(key, value);
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("write {key} failed across failover: {e}"),
                    }
                    i += 1;
                }
            })
        })
        .collect();
    let wait_count = |n: u64| wait_for_count(&count, n, TIMEOUT);
    wait_count(300).await;
    c.kill(leader);
    let before = count.load(Ordering::Relaxed);
    wait_count(before + 300).await;
    let new_leader = c.wait_for_leader(TIMEOUT).await;
    assert_ne!(new_leader, leader);
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let acked = acked.lock().expect("lock").clone();
    assert_all_present(&client, &acked, "after the leader's kill -9").await;

    // kill -9 of every replica, and all three back: everything acknowledged is still there.
    for id in c.ids() {
        c.kill(id);
    }
    for id in c.ids() {
        c.spawn(id);
    }
    let leader = c.wait_for_leader(TIMEOUT).await;
    let client = client_of(&c);
    assert_all_present(&client, &acked, "after a kill -9 of all three").await;
    let target = c.status(leader).expect("status").last_log_index;
    for id in c.ids() {
        c.wait_applied(id, target, TIMEOUT).await;
    }

    // The data directory keeps its engine: the other one is refused, naming both and the flag.
    let victim = c.other_than(leader);
    c.kill(victim);
    let args = c.args_of(victim);
    c.expect_refusal(
        victim,
        &with_engine(&args, "segments"),
        "made with the sled engine, but this coordinator was started with --raft-log segments",
        TIMEOUT,
    );
    // With its own flags it rejoins and catches up.
    client
        .insert("while-away", "1", false)
        .await
        .expect("insert with 2 of 3");
    c.spawn(victim);
    let leader = c.wait_for_leader(TIMEOUT).await;
    let target = c.status(leader).expect("status").last_log_index;
    c.wait_applied(victim, target, TIMEOUT).await;

    // sled's log file lost (emptied): refused, no panic, and the other two keep serving. (A cut
    // that happens to keep every live segment is no damage: sled reuses its file's segments, so
    // where a cut falls decides nothing here; the storage tests cut it at known places.)
    let victim = c.other_than(leader);
    c.kill(victim);
    let db = c.replica(victim).data_dir.join("raft/sled/db");
    std::fs::write(&db, b"").expect("empty sled's log");
    let args = c.args_of(victim);
    c.expect_refusal(victim, &args, "is damaged", TIMEOUT);
    client
        .insert("still", "serving", false)
        .await
        .expect("the other two still serve");
}

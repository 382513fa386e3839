//! The replicated key-value store, end to end: real `coordinator` processes on loopback.
//!
//! Here: what the store promises (reads through every replica, parked gets, no acknowledged write
//! lost to a leader kill or a full restart, precise errors, retries applied once, batching).
//! Beside it: the HTTP port's health, status and metrics (`kv_cluster/http.rs`), and how
//! entries travel to the followers, pre-appends and links (`kv_cluster/replication.rs`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::metadata::WireRequestId;
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_tests::cluster::wait_for_count;
use coord_tests::{http, Cluster, ClusterOptions};
use tonic::Code;

const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

fn client_of(endpoints: Vec<String>) -> CoordClient {
    CoordClient::new(ClientOptions::new(endpoints)).expect("client")
}

/// A cluster with a leader, and a client that has found it.
async fn started(options: ClusterOptions) -> (Cluster, u64, CoordClient) {
    let mut c = Cluster::start(options);
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = client_of(c.endpoints());
    client.find_leader().await;
    (c, leader, client)
}

/// A client that talks to one replica only, so requests to a follower must be forwarded.
fn client_via(c: &Cluster, id: u64) -> CoordClient {
    client_of(vec![c.replica(id).grpc.to_string()])
}

// `/livez`, `/readyz`, `/status` and `/metrics` of a live ensemble.
#[path = "kv_cluster/http.rs"]
mod http_port;

// Pre-appends and the Raft links.
#[path = "kv_cluster/replication.rs"]
mod replication;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_each_replica_are_read_through_every_replica() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(LEADER_TIMEOUT).await;
    for id in c.ids() {
        let cl = client_via(&c, id);
        cl.insert(&format!("/dir//via{id}/"), format!("value-{id}"), false)
            .await
            .unwrap_or_else(|e| panic!("insert through replica {id}: {e}"));
    }
    for id in c.ids() {
        let cl = client_via(&c, id);
        for w in c.ids() {
            let v = cl.try_get(&format!("dir/via{w}")).await.expect("try_get");
            assert_eq!(
                v,
                Some(Bytes::from(format!("value-{w}"))),
                "via replica {id}"
            );
        }
        let dir = cl.get_dir("dir").await.expect("get_dir");
        let keys: Vec<_> = dir.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, vec!["dir/via1", "dir/via2", "dir/via3"]);
    }
    let cl = client_via(&c, 2);
    cl.delete("dir").await.expect("delete");
    assert!(cl.get_dir("dir").await.expect("get_dir").is_empty());
    assert_eq!(
        client_via(&c, 3)
            .try_get("dir/via1")
            .await
            .expect("try_get"),
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_get_is_released_by_an_insert() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = c.other_than(leader);
    // Through a follower, so the parked call is a forwarded one.
    let waiter = {
        let cl = client_via(&c, follower);
        tokio::spawn(async move { cl.get("late/key").await })
    };
    c.wait_until(
        Duration::from_secs(20),
        "the get to park on the leader",
        |c| c.metric(leader, "coord_parked_calls") >= 1.0,
    )
    .await;
    assert!(!waiter.is_finished());
    client_via(&c, leader)
        .insert("late/key", "here", false)
        .await
        .expect("insert");
    let got = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("parked get released")
        .expect("join")
        .expect("get");
    assert_eq!(got, Bytes::from("here"));
    assert_eq!(c.metric(leader, "coord_parked_calls"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_under_load_loses_no_acknowledged_write() {
    let (mut c, leader, client) = started(ClusterOptions::default()).await;

    let acked = Arc::new(Mutex::new(BTreeSet::new()));
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
                    match client.insert(&key, vec![7u8; 256], false).await {
                        Ok(()) => {
                            acked.lock().expect("lock").insert(key);
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("write {key} failed across failover: {e}"),
                    }
                    i += 1;
                }
            })
        })
        .collect();

    let wait_count = |n: u64| wait_for_count(&count, n, Duration::from_secs(60));
    wait_count(300).await;
    c.kill(leader);
    let before = count.load(Ordering::Relaxed);
    // The load goes on through the survivors.
    wait_count(before + 300).await;
    let new_leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(new_leader, leader);
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }

    let acked = acked.lock().expect("lock").clone();
    let mut all = BTreeSet::new();
    for w in 0..8 {
        for (k, _) in client.get_dir(&format!("load/{w}")).await.expect("get_dir") {
            all.insert(k);
        }
    }
    let missing: Vec<_> = acked.difference(&all).collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged writes lost, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );

    // The killed replica comes back and catches up.
    c.spawn(leader);
    let target = c.status(new_leader).expect("leader status").last_log_index;
    c.wait_applied(leader, target, Duration::from_secs(60))
        .await;
    c.wait_until(
        Duration::from_secs(30),
        "the restarted replica to be ready",
        |c| http::get(c.replica(leader).http, "/readyz").is_ok_and(|(code, _)| code == 200),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_and_starting_all_three_keeps_every_write() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = client_of(c.endpoints());
    for i in 0..200 {
        client
            .insert(&format!("keep/{i}"), format!("{i}"), false)
            .await
            .expect("insert");
    }
    for id in c.ids() {
        c.kill(id);
    }
    for id in c.ids() {
        c.spawn(id);
    }
    c.wait_for_leader(LEADER_TIMEOUT).await;
    let client = client_of(c.endpoints());
    let got = client.get_dir("keep").await.expect("get_dir");
    assert_eq!(got.len(), 200, "writes lost across a full restart");
    for (k, v) in got {
        assert_eq!(
            k.strip_prefix("keep/").map(str::to_string),
            Some(String::from_utf8_lossy(&v).to_string())
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_precise_error_and_changes_nothing() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = c.other_than(leader);
    let cl = client_via(&c, follower);
    let expect = |r: Result<(), tonic::Status>, code: Code, needle: &str| {
        let e = r.expect_err("must fail");
        assert_eq!(e.code(), code, "{e:?}");
        assert!(
            e.message().contains(needle),
            "message {:?} should mention {needle:?}",
            e.message()
        );
    };
    expect(
        cl.insert("", "v", false).await,
        Code::InvalidArgument,
        "empty",
    );
    expect(
        cl.insert("///", "v", false).await,
        Code::InvalidArgument,
        "empty",
    );
    let long_key = "k".repeat(4097);
    expect(
        cl.insert(&long_key, "v", false).await,
        Code::InvalidArgument,
        "4097 bytes",
    );
    expect(
        cl.insert("big", vec![0u8; (4 << 20) + 1], false).await,
        Code::InvalidArgument,
        "\"big\"",
    );
    expect(cl.delete("").await, Code::InvalidArgument, "empty");
    cl.insert("once", "1", false).await.expect("first insert");
    expect(
        cl.insert("/once/", "2", false).await,
        Code::AlreadyExists,
        "\"once\"",
    );
    assert_eq!(
        cl.try_get("once").await.expect("try_get"),
        Some(Bytes::from("1"))
    );
    let mut raw =
        CoordinationServiceClient::connect(format!("http://{}", c.replica(follower).grpc))
            .await
            .expect("connect");
    let missing = raw
        .try_get_key_value(tf::TryGetKeyValueRequest {
            key: "nope/x".into(),
        })
        .await
        .expect_err("missing key");
    assert_eq!(missing.code(), Code::NotFound);
    assert!(missing.message().contains("nope/x"));
    let e = cl.get_dir("").await.expect_err("empty dir");
    assert_eq!(e.code(), Code::InvalidArgument);
    // Exactly one key was written by all of the above.
    assert_eq!(c.metric(leader, "coord_kv_keys"), 1.0);
    assert!(cl.try_get(&long_key).await.is_err());
    assert_eq!(cl.try_get("big").await.expect("try_get"), None);
    // A value at the limit is accepted.
    cl.insert("max", vec![1u8; 4 << 20], false)
        .await
        .expect("4 MiB value");
    assert_eq!(
        cl.try_get("max").await.expect("try_get").map(|v| v.len()),
        Some(4 << 20)
    );
    for id in c.ids() {
        assert!(c.is_running(id), "replica {id} died on bad input");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_request_is_applied_once() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = c.other_than(leader);
    let id = WireRequestId {
        client: 4242,
        seq: 1,
        acked_below: 1,
    };
    let req = || {
        let mut r = tonic::Request::new(tf::InsertKeyValueRequest {
            kv: Some(tf::KeyValueEntry {
                key: "dedupe".into(),
                value: Bytes::from("v"),
            }),
            allow_overwrite: false,
        });
        id.write(r.metadata_mut());
        r
    };
    let mut via_leader =
        CoordinationServiceClient::connect(format!("http://{}", c.replica(leader).grpc))
            .await
            .expect("connect");
    let mut via_follower =
        CoordinationServiceClient::connect(format!("http://{}", c.replica(follower).grpc))
            .await
            .expect("connect");
    via_leader.insert_key_value(req()).await.expect("first");
    // The same request again, through another replica: it gets the first answer (OK), not
    // ALREADY_EXISTS, and nothing is applied twice.
    via_follower
        .insert_key_value(req())
        .await
        .expect("retry gets the first result");
    via_leader
        .insert_key_value(req())
        .await
        .expect("retry gets the first result");
    // A new request id is a new request.
    let mut fresh = req();
    WireRequestId {
        seq: 2,
        acked_below: 2,
        ..id
    }
    .write(fresh.metadata_mut());
    let e = via_leader
        .insert_key_value(fresh)
        .await
        .expect_err("second insert");
    assert_eq!(e.code(), Code::AlreadyExists);
    // Once the client acknowledged seq 1 (acked_below = 2), a late copy of it is refused.
    let mut late = req();
    WireRequestId {
        acked_below: 1,
        ..id
    }
    .write(late.metadata_mut());
    let e = via_leader
        .insert_key_value(late)
        .await
        .expect_err("late duplicate");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_entries_and_syncs() {
    let (c, leader, client) = started(ClusterOptions::default()).await;
    let syncs_before = c.metric(leader, "coord_log_syncs_total");
    let entries_before = c.metric(leader, "coord_proposal_entries_total");
    let n = 400;
    let writes: Vec<_> = (0..n)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.insert(&format!("gc/{i}"), "v", false).await })
        })
        .collect();
    for w in writes {
        w.await.expect("join").expect("insert");
    }
    let syncs = c.metric(leader, "coord_log_syncs_total") - syncs_before;
    let entries = c.metric(leader, "coord_proposal_entries_total") - entries_before;
    assert!(
        entries < f64::from(n) / 2.0,
        "{n} concurrent writes took {entries} Raft entries"
    );
    assert!(
        syncs < f64::from(n) / 2.0,
        "{n} concurrent writes took {syncs} log syncs on the leader"
    );
    assert_eq!(
        client.get_dir("gc").await.expect("get_dir").len(),
        n as usize
    );
}

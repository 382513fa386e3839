//! The replicated key-value store, end to end: real `coordinator` processes on loopback.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints_report_health_and_status() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.wait_until(Duration::from_secs(30), "every replica to be ready", |c| {
        c.ids()
            .iter()
            .all(|&id| http::get(c.replica(id).http, "/readyz").is_ok_and(|(code, _)| code == 200))
    })
    .await;
    for id in c.ids() {
        let r = c.replica(id);
        assert_eq!(http::get(r.http, "/livez").expect("livez").0, 200);
        let s = c.status(id).expect("status");
        assert_eq!(s.id, id);
        assert_eq!(s.leader_id, Some(leader));
        let (code, body) = http::get(r.http, "/status").expect("status");
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["members"].as_array().map(Vec::len), Some(3));
        let (code, metrics) = http::get(r.http, "/metrics").expect("metrics");
        assert_eq!(code, 200);
        for name in [
            "coord_raft_term",
            "coord_log_sync_seconds_bucket",
            "coord_commit_latency_seconds_count",
            "coord_parked_calls",
        ] {
            assert!(metrics.contains(name), "{name} missing from /metrics");
        }
    }
    // With two replicas down, nobody is ready: no quorum, no leader.
    let others: Vec<u64> = c.ids().into_iter().filter(|&i| i != leader).collect();
    for id in &others {
        c.kill(*id);
    }
    c.wait_until(
        Duration::from_secs(30),
        "the lone replica to report not ready",
        |c| http::get(c.replica(leader).http, "/readyz").is_ok_and(|(code, _)| code == 503),
    )
    .await;
    c.wait_until(
        Duration::from_secs(30),
        "the lone replica to report no leader",
        |c| c.metric(leader, "coord_has_leader") == 0.0,
    )
    .await;
}

/// `/metrics` of a live ensemble follows Prometheus' conventions: counters end in `_total`,
/// every metric has one HELP and one TYPE line, status codes carry gRPC's names, and the
/// metrics every exporter is expected to have are there (`coord_has_leader`,
/// `coord_build_info`, `process_*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_prometheus_conventions() {
    const GRPC_CODES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    let (c, leader, client) = started(ClusterOptions::default()).await;
    client.insert("m/1", "v", false).await.expect("insert");
    // A refused call, so that a code other than OK is counted.
    let refused = client.insert("m/1", "w", false).await;
    assert!(refused.is_err(), "a second insert of one key was accepted");
    let (_, body) = http::get(c.replica(leader).http, "/metrics").expect("GET /metrics");
    let mut helps = std::collections::HashMap::<&str, usize>::new();
    let mut types = std::collections::HashMap::<&str, usize>::new();
    for line in body.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["#", "HELP", name, ..] => *helps.entry(name).or_default() += 1,
            ["#", "TYPE", name, kind] => {
                *types.entry(name).or_default() += 1;
                if *kind == "counter" {
                    assert!(
                        name.ends_with("_total"),
                        "counter {name} does not end in _total"
                    );
                }
            }
            _ => {}
        }
        if let Some((_, rest)) = line.split_once("code=\"") {
            let code = rest.split('"').next().unwrap_or_default();
            assert!(GRPC_CODES.contains(&code), "code {code:?} in {line}");
        }
    }
    for (name, n) in helps.iter().chain(types.iter()) {
        assert_eq!(*n, 1, "{name} has {n} HELP or TYPE lines");
    }
    assert!(body.contains("code=\"OK\""), "no OK calls counted");
    assert!(
        body.lines()
            .any(|l| l.contains("code=") && !l.contains("code=\"OK\"")),
        "the refused insert was not counted"
    );
    let version = env!("CARGO_PKG_VERSION");
    let info = body
        .lines()
        .find(|l| l.starts_with("coord_build_info{"))
        .expect("coord_build_info");
    assert!(
        info.starts_with(&format!(
            "coord_build_info{{version=\"{version}\",commit=\""
        )) && info.ends_with("\"} 1")
            && !info.contains("commit=\"\""),
        "{info}"
    );
    for id in c.ids() {
        assert_eq!(c.metric(id, "coord_has_leader"), 1.0, "replica {id}");
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(c.metric(id, name) > 0.0, "{name} of replica {id}");
        }
        // CPU time counts in clock ticks (10 ms): a quiet follower may not have used one yet.
        assert!(c.metric(id, "process_cpu_seconds_total") >= 0.0);
    }
    // The leader's CPU time grows with the work it does.
    let before = c.metric(leader, "process_cpu_seconds_total");
    for i in 0..300 {
        client
            .insert(&format!("m/cpu/{i}"), "v", false)
            .await
            .expect("insert");
    }
    let after = c.metric(leader, "process_cpu_seconds_total");
    assert!(
        after > before,
        "the leader's CPU time went from {before} to {after} over 300 writes"
    );
}

/// A lone write goes to a follower while the leader syncs it (a pre-append), and the follower's
/// log takes it: the counters on both sides move, and every write is read back, also after the
/// leader is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_writes_reach_a_follower_before_the_leaders_sync() {
    let (mut c, leader, client) = started(ClusterOptions::default()).await;
    let n = 50;
    for i in 0..n {
        client
            .insert(&format!("lone/{i}"), format!("v{i}"), false)
            .await
            .expect("insert");
    }
    let sent = c.metric(leader, "coord_pre_appends_sent_total");
    let written: f64 = c
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .map(|id| c.metric(id, "coord_pre_appends_written_total"))
        .sum();
    // The first writes go the usual way while the connection is made.
    assert!(
        sent >= f64::from(n) / 2.0,
        "{sent} of {n} lone writes sent ahead"
    );
    assert!(
        written >= 1.0,
        "followers wrote {written} of {sent} pre-appends"
    );

    c.kill(leader);
    let next = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(next, leader);
    let dir = client
        .get_dir("lone")
        .await
        .expect("get_dir after the leader's death");
    assert_eq!(dir.len(), n as usize);
    for (k, v) in dir {
        let i = k.strip_prefix("lone/").expect("key");
        assert_eq!(v, Bytes::from(format!("v{i}")));
    }
}

/// A follower that stops keeping up (here: paused) no longer gets the leader's pre-appends; the
/// one that keeps up does, so lone writes still have their syncs overlapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_appends_go_to_the_follower_that_keeps_up() {
    let (c, leader, client) = started(ClusterOptions::default()).await;
    for i in 0..20 {
        client
            .insert(&format!("warm/{i}"), "v", false)
            .await
            .expect("insert");
    }
    let written = |c: &Cluster, id| c.metric(id, "coord_pre_appends_written_total");
    let followers: Vec<u64> = c.ids().into_iter().filter(|id| *id != leader).collect();
    let (a, b) = (followers[0], followers[1]);
    let (taker, other) = if written(&c, a) >= written(&c, b) {
        (a, b)
    } else {
        (b, a)
    };
    assert!(written(&c, taker) >= 1.0, "no follower took a pre-append");

    c.pause(taker);
    // The first of these find the paused follower level with the other and open the
    // connection to the other.
    let lone = |i| format!("lone/{i}");
    for i in 0..10 {
        client.insert(&lone(i), "v", false).await.expect("insert");
    }
    // What reached `other`: written, or passed by because the leader's AppendEntries brought the
    // entry first (a race that a loaded machine decides either way; which follower a pre-append
    // goes to is what this test is about).
    let received =
        |c: &Cluster| written(c, other) + c.metric(other, "coord_pre_appends_passed_total");
    let before = received(&c);
    let n = 40;
    for i in 10..10 + n {
        client
            .insert(&lone(i), "v", false)
            .await
            .expect("insert with one follower paused");
    }
    let taken = received(&c) - before;
    c.resume(taker);
    assert!(
        taken >= f64::from(n) * 0.75,
        "replica {other} received {taken} of {n} lone writes' pre-appends while replica {taker} was paused"
    );
    let dir = client.get_dir("lone").await.expect("get_dir");
    assert_eq!(dir.len(), 10 + n as usize);
}

/// AppendEntries travel over the plain links (`raft_link`) of a plain ensemble, and over gRPC
/// only with `--no-raft-links`; both ways replicate every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_entries_go_over_links_unless_turned_off() {
    for links in [true, false] {
        let mut options = ClusterOptions::default();
        if !links {
            options.extra_args.push("--no-raft-links".into());
        }
        let (c, leader, client) = started(options).await;
        let n = 20;
        for i in 0..n {
            client
                .insert(&format!("linked/{i}"), "v", false)
                .await
                .expect("insert");
        }
        let calls = c.metric(leader, "coord_raft_link_calls_total");
        if links {
            // Each write is at least one AppendEntries with its entry to each follower.
            assert!(
                calls >= f64::from(n),
                "{calls} calls over links for {n} writes"
            );
        } else {
            assert_eq!(calls, 0.0, "links were turned off");
        }
        let follower = c.other_than(leader);
        let dir = client_via(&c, follower)
            .get_dir("linked")
            .await
            .expect("get_dir through a follower");
        assert_eq!(dir.len(), n as usize, "links {links}");
    }
}

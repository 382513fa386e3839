//! Namespaces: one ensemble, many jobs. Each namespace has its own keys, tasks, barriers, torch
//! store and limits; the namespace comes from the connection (coord-proxy `--namespace`, a
//! client's `coord-namespace` header, or a task certificate), never from a request field.
//!
//! Real replicas on loopback; the clients are coord's own, torch's wire through coord-proxy, and
//! (over TLS) certificates made by the test's CA.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::coord::admin::{DeclareNamespaceRequest, NamespaceLimits, NamespaceShape};
use coord_proto::tensorflow as tf;
use coord_tests::cluster::{Cluster, ClusterOptions};
use coord_tests::tcpstore_client::StoreClient;
use coord_tests::torch::StoreSidecar;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(60);

fn client(c: &Cluster, namespace: Option<&str>) -> CoordClient {
    let mut options = ClientOptions::new(c.endpoints());
    options.namespace = namespace.map(str::to_string);
    options.unavailable_after = TIMEOUT;
    CoordClient::new(options).expect("client")
}

fn task(id: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: id,
        recoverable: false,
    }
}

fn workers(n: u32) -> NamespaceShape {
    NamespaceShape {
        jobs: [("worker".to_string(), n)].into_iter().collect(),
        heartbeat_timeout_ms: 30_000,
        ..NamespaceShape::default()
    }
}

async fn declare(ops: &CoordClient, name: &str, shape: NamespaceShape, limits: NamespaceLimits) {
    let reply = ops
        .declare_namespace(DeclareNamespaceRequest {
            name: name.into(),
            shape: Some(shape),
            limits: Some(limits),
        })
        .await
        .unwrap_or_else(|e| panic!("declare {name}: {e:?}"));
    assert!(reply.created, "{name} was new");
}

fn assert_refused(err: &tonic::Status, code: Code, words: &[&str]) {
    assert_eq!(err.code(), code, "{err:?}");
    for w in words {
        assert!(
            err.message().contains(w),
            "{w:?} not in {:?}",
            err.message()
        );
    }
}

/// Two jobs with the same key names, task names and barrier ids, each in its own namespace, and
/// the replicas' own job in the default one: each sees only its own, through a leader kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_in_two_namespaces_share_names_and_nothing_else() {
    let mut c = Cluster::start(ClusterOptions {
        extra_args: vec!["--job".into(), "worker=2".into()],
        ..ClusterOptions::default()
    });
    c.wait_for_leader(TIMEOUT).await;
    let ops = client(&c, None);
    for ns in ["a", "b"] {
        declare(&ops, ns, workers(2), NamespaceLimits::default()).await;
    }
    let (a, b) = (client(&c, Some("a")), client(&c, Some("b")));
    for (cl, value) in [(&a, "in a"), (&b, "in b"), (&ops, "default")] {
        cl.insert("k", Bytes::from(value), false)
            .await
            .expect("put");
    }
    for _ in 0..3 {
        a.increment("n", 1).await.expect("increment");
    }
    assert_eq!(b.increment("n", 1).await.expect("increment"), 1);
    assert_eq!(a.get("k").await.expect("get"), Bytes::from("in a"));
    assert_eq!(b.get("k").await.expect("get"), Bytes::from("in b"));
    assert_eq!(ops.get("k").await.expect("get"), Bytes::from("default"));

    // A watch in a sees a's changes of its key, not b's of the same key.
    let mut watch = a.open_watch("w", 0).await.expect("watch in a");
    let started = watch
        .message()
        .await
        .expect("stream")
        .expect("first answer");
    assert!(started.events.is_empty(), "{started:?}");
    b.insert("w", Bytes::from("from b"), false)
        .await
        .expect("put");
    a.insert("w", Bytes::from("from a"), false)
        .await
        .expect("put");
    let seen = tokio::time::timeout(TIMEOUT, watch.message())
        .await
        .expect("an event within the timeout")
        .expect("stream")
        .expect("an answer");
    let values: Vec<Bytes> = seen.events.iter().map(|e| e.value.clone()).collect();
    assert_eq!(values, vec![Bytes::from("from a")]);
    drop(watch);

    // The same tasks register in both; a barrier of a passes while b's same barrier id waits.
    for cl in [&a, &b] {
        for id in 0..2 {
            cl.register_task(&task(id), 7).await.expect("register");
        }
    }
    let a2 = a.clone();
    let in_a = tokio::spawn(async move { a2.barrier("sync", 0, TIMEOUT, &[], &task(1)).await });
    a.barrier("sync", 0, TIMEOUT, &[], &task(0))
        .await
        .expect("a's barrier passes with a's two tasks");
    in_a.await.expect("join").expect("a's barrier");
    let lone = b
        .barrier("sync", 0, Duration::from_millis(500), &[], &task(0))
        .await
        .expect_err("b's task 1 never came");
    assert_eq!(lone.code(), Code::DeadlineExceeded, "{lone:?}");

    // An error in a fails a's job only.
    a.report_error(&task(1), 13, "oom in a")
        .await
        .expect("report");
    let states = |cl: CoordClient| async move {
        let resp = cl.task_states(&[]).await.expect("task states");
        resp.tasks
            .into_iter()
            .map(|t| t.state)
            .collect::<Vec<i32>>()
    };
    let connected = tf::CoordinatedTaskState::TaskstateConnected as i32;
    assert!(states(a.clone()).await.iter().any(|s| *s != connected));
    assert_eq!(states(b.clone()).await, vec![connected, connected]);
    assert_eq!(
        states(ops.clone()).await,
        vec![tf::CoordinatedTaskState::TaskstateDisconnected as i32; 2],
        "the default namespace's tasks never registered"
    );

    // kill -9 the leader: every namespace goes on, with its own state.
    let leader = c.wait_for_leader(TIMEOUT).await;
    c.kill(leader);
    assert_eq!(
        a.get("k").await.expect("get after kill"),
        Bytes::from("in a")
    );
    assert_eq!(b.increment("n", 1).await.expect("increment"), 2);
    let b2 = b.clone();
    let in_b = tokio::spawn(async move { b2.barrier("sync", 1, TIMEOUT, &[], &task(1)).await });
    b.barrier("sync", 1, TIMEOUT, &[], &task(0))
        .await
        .expect("b's next barrier passes");
    in_b.await.expect("join").expect("b's barrier");
}

/// torch's stores of two jobs through two sidecars: the same keys, two stores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_stores_of_two_namespaces_are_two() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let one = StoreSidecar::start_with(&c.endpoints(), &["--namespace", "job-1"]);
    let two = StoreSidecar::start_with(&c.endpoints(), &["--namespace", "job-2"]);
    let mut s1 = StoreClient::connect(&one.store).await.expect("connect");
    let mut s2 = StoreClient::connect(&two.store).await.expect("connect");
    s1.set(b"/rdzv/state", b"one").await.expect("set");
    s2.set(b"/rdzv/state", b"two").await.expect("set");
    assert_eq!(s1.add(b"/rdzv/count", 1).await.expect("add"), 1);
    assert_eq!(s2.add(b"/rdzv/count", 5).await.expect("add"), 5);
    assert_eq!(s1.get(b"/rdzv/state").await.expect("get"), b"one");
    assert_eq!(s2.get(b"/rdzv/state").await.expect("get"), b"two");
    // The namespaces exist, each holding its own two keys.
    let rows = client(&c, None).list_namespaces().await.expect("list");
    let keys: Vec<(String, u64)> = rows.iter().map(|r| (r.name.clone(), r.keys)).collect();
    assert_eq!(
        keys,
        vec![
            ("default".into(), 0),
            ("job-1".into(), 2),
            ("job-2".into(), 2)
        ]
    );
}

/// A namespace at each of its limits is refused, with a message naming it and the limit, while
/// a quiet namespace runs barriers and key-values beside it without a single failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_at_its_limits_leaves_the_others_alone() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let ops = client(&c, None);
    let limits = |f: &dyn Fn(&mut NamespaceLimits)| {
        let mut l = NamespaceLimits::default();
        f(&mut l);
        l
    };
    declare(&ops, "quiet", workers(2), NamespaceLimits::default()).await;
    declare(&ops, "keys", workers(1), limits(&|l| l.max_keys = 20)).await;
    declare(
        &ops,
        "bytes",
        workers(1),
        limits(&|l| l.max_bytes = 64 << 10),
    )
    .await;
    declare(&ops, "rate", workers(1), limits(&|l| l.writes_per_sec = 20)).await;
    declare(&ops, "parked", workers(1), limits(&|l| l.max_parked = 4)).await;

    let quiet = client(&c, Some("quiet"));
    for id in 0..2 {
        quiet.register_task(&task(id), 1).await.expect("register");
    }
    let stop = Arc::new(AtomicU64::new(0));
    let rounds = {
        let (quiet, stop) = (quiet.clone(), stop.clone());
        tokio::spawn(async move {
            let mut round = 0i64;
            while stop.load(Ordering::Relaxed) == 0 {
                let other = quiet.clone();
                let peer = tokio::spawn(async move {
                    other.barrier("step", round, TIMEOUT, &[], &task(1)).await
                });
                quiet.barrier("step", round, TIMEOUT, &[], &task(0)).await?;
                peer.await.expect("join")?;
                quiet
                    .insert(&format!("step/{round}"), Bytes::from("done"), false)
                    .await?;
                round += 1;
            }
            Ok::<i64, tonic::Status>(round)
        })
    };

    let keys = client(&c, Some("keys"));
    for i in 0..20 {
        keys.insert(&format!("k{i}"), Bytes::from("v"), false)
            .await
            .expect("under the key limit");
    }
    let err = keys
        .insert("k20", Bytes::from("v"), false)
        .await
        .expect_err("past the key limit");
    assert_refused(&err, Code::ResourceExhausted, &["\"keys\"", "max_keys"]);

    let bytes = client(&c, Some("bytes"));
    let big = Bytes::from(vec![b'x'; 16 << 10]);
    let mut refused = None;
    for i in 0..8 {
        if let Err(e) = bytes.insert(&format!("b{i}"), big.clone(), false).await {
            refused = Some(e);
            break;
        }
    }
    let err = refused.expect("64 KiB of 16 KiB values fills the namespace");
    assert_refused(&err, Code::ResourceExhausted, &["\"bytes\"", "max_bytes"]);

    let rate = client(&c, Some("rate"));
    let writes: Vec<_> = (0..100)
        .map(|i| {
            let rate = rate.clone();
            tokio::spawn(async move { rate.increment(&format!("r{}", i % 10), 1).await })
        })
        .collect();
    let mut limited = None;
    let mut passed = 0;
    for w in writes {
        match w.await.expect("join") {
            Ok(_) => passed += 1,
            Err(e) => limited = Some(e),
        }
    }
    let err = limited.expect("100 writes at once exceed 20 a second");
    assert_refused(
        &err,
        Code::ResourceExhausted,
        &["\"rate\"", "writes_per_sec"],
    );
    assert!((20..100).contains(&passed), "{passed} of 100 passed");

    let parked = client(&c, Some("parked"));
    let waiting: Vec<_> = (0..4)
        .map(|i| {
            let parked = parked.clone();
            tokio::spawn(async move { parked.get(&format!("never/{i}")).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let rows = ops.list_namespaces().await.expect("list");
        if rows.iter().any(|r| r.name == "parked" && r.parked == 4) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the four gets never parked: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = tokio::time::timeout(TIMEOUT, parked.get("never/5"))
        .await
        .expect("the fifth get is answered at once")
        .expect_err("the fifth get is refused");
    assert_refused(&err, Code::ResourceExhausted, &["\"parked\"", "max_parked"]);
    // A watch holds a slot of the same bound.
    let refused = match tokio::time::timeout(TIMEOUT, parked.open_watch("w", 0))
        .await
        .expect("the watch is answered at once")
    {
        Err(e) => e,
        Ok(mut stream) => tokio::time::timeout(TIMEOUT, stream.message())
            .await
            .expect("the watch's refusal comes at once")
            .expect_err("the watch is refused"),
    };
    assert_refused(
        &refused,
        Code::ResourceExhausted,
        &["\"parked\"", "max_parked"],
    );
    for w in &waiting {
        assert!(!w.is_finished(), "the four parked gets still wait");
    }

    stop.store(1, Ordering::Relaxed);
    let rounds = rounds
        .await
        .expect("join")
        .expect("the quiet namespace never failed");
    assert!(rounds > 0, "the quiet namespace made progress");
    for w in waiting {
        w.abort();
    }
}

/// Namespaces survive a snapshot and a restart of every replica, and a backup and restore; a
/// delete is one entry that gives the memory back; the name then comes back as a fresh namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_survive_restarts_and_a_delete_gives_their_memory_back() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let ops = client(&c, None);
    declare(&ops, "keep", workers(1), NamespaceLimits::default()).await;
    declare(&ops, "gone", workers(1), NamespaceLimits::default()).await;
    let (keep, gone) = (client(&c, Some("keep")), client(&c, Some("gone")));
    keep.insert("k", Bytes::from("kept"), false)
        .await
        .expect("put");
    let value = Bytes::from(vec![b'g'; 4 << 10]);
    for i in 0..128 {
        gone.insert(&format!("g/{i}"), value.clone(), false)
            .await
            .expect("put");
    }
    let before = c.settled_state_bytes(TIMEOUT).await;

    // A snapshot on every replica, then every replica restarted from it and its log.
    for i in 0..c.endpoints().len() {
        ops.snapshot_of(i).await.expect("snapshot");
    }
    let ids: Vec<u64> = c.replicas.iter().map(|r| r.id).collect();
    for id in &ids {
        c.kill(*id);
    }
    for id in &ids {
        c.spawn(*id);
    }
    c.wait_for_leader(TIMEOUT).await;
    assert_eq!(keep.get("k").await.expect("kept"), Bytes::from("kept"));
    assert_eq!(gone.get_dir("g").await.expect("dir").len(), 128);

    ops.delete_namespace("gone").await.expect("delete");
    let after = c.settled_state_bytes(TIMEOUT).await;
    assert!(
        after + 128 * 4096 <= before,
        "state bytes {before} -> {after} after deleting 512 KiB"
    );
    let err = gone.get("g/0").await.expect_err("gone");
    assert_refused(&err, Code::NotFound, &["\"gone\"", "does not exist"]);
    declare(&ops, "gone", workers(3), NamespaceLimits::default()).await;
    assert_eq!(gone.try_get("g/0").await.expect("try get"), None);
    assert_eq!(keep.get("k").await.expect("kept"), Bytes::from("kept"));

    // A backup holds every namespace, and a new ensemble restored from it has them.
    let (_, backup) = ops.backup().await.expect("backup");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("backup.bin");
    std::fs::write(&file, &backup).expect("write the backup");
    drop(c);
    let mut restored = Cluster::start(ClusterOptions {
        extra_args: vec!["--restore".into(), file.display().to_string()],
        ..ClusterOptions::default()
    });
    restored.wait_for_leader(TIMEOUT).await;
    let names: Vec<String> = client(&restored, None)
        .list_namespaces()
        .await
        .expect("list")
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(names, ["default", "gone", "keep"]);
    let keep = client(&restored, Some("keep"));
    assert_eq!(keep.get("k").await.expect("restored"), Bytes::from("kept"));
}

/// Over TLS a task certificate names its namespace: the task acts there and nowhere else,
/// whatever namespace its calls name; an operator's certificate acts in any.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_certificate_acts_only_in_its_own_namespace() {
    let mut c = Cluster::start(ClusterOptions {
        tls: true,
        ..ClusterOptions::default()
    });
    c.wait_for_leader(TIMEOUT).await;
    let pki = c.pki();
    let tls_client = |identity: &coord_proto::tls::Identity, ns: Option<&str>| {
        let mut options = ClientOptions::new(c.endpoints());
        options.tls = Some(pki.client(Some(identity)));
        options.namespace = ns.map(str::to_string);
        options.unavailable_after = Duration::from_secs(10);
        CoordClient::new(options).expect("client")
    };
    let ops_id = pki.client_identity("ops");
    let ops = tls_client(&ops_id, None);
    declare(&ops, "A", workers(1), NamespaceLimits::default()).await;
    declare(&ops, "AB", workers(1), NamespaceLimits::default()).await;

    let a_task = pki.task_in("A", "worker", 0);
    let own = tls_client(&a_task, None);
    own.insert("k", Bytes::from("a's"), false)
        .await
        .expect("a task writes in its own namespace");
    own.register_task(&task(0), 1).await.expect("register in A");
    let in_a = tls_client(&ops_id, Some("A"));
    assert_eq!(in_a.get("k").await.expect("get"), Bytes::from("a's"));

    for other in ["AB", "default"] {
        let elsewhere = tls_client(&a_task, Some(other));
        let err = elsewhere
            .insert("k", Bytes::from("x"), true)
            .await
            .expect_err("a write in another namespace");
        assert_refused(
            &err,
            Code::PermissionDenied,
            &["\"A\"", "its own namespace"],
        );
        let err = elsewhere
            .register_task(&task(0), 1)
            .await
            .expect_err("a registration in another namespace");
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
        let err = elsewhere
            .heartbeat(&task(0), 1)
            .await
            .expect_err("a heartbeat in another namespace");
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
        let err = elsewhere.get("k").await.expect_err("a read");
        assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    }
    let err = tls_client(&a_task, Some("A/.."))
        .get("k")
        .await
        .expect_err("a path trick");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    let err = own
        .delete_namespace("AB")
        .await
        .expect_err("a task deletes no namespace");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Nothing reached AB.
    let in_ab = tls_client(&ops_id, Some("AB"));
    assert_eq!(in_ab.try_get("k").await.expect("try get"), None);
    let resp = in_ab.task_states(&[]).await.expect("states");
    assert_eq!(
        resp.tasks[0].state,
        tf::CoordinatedTaskState::TaskstateDisconnected as i32
    );
}

/// A namespace with a TTL is deleted once it has had no command for that long with no task
/// connected; one whose task is still connected stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_namespace_is_deleted_after_its_ttl() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let ops = client(&c, None);
    let ttl = NamespaceLimits {
        ttl_ms: 1_500,
        ..NamespaceLimits::default()
    };
    declare(&ops, "brief", workers(1), ttl).await;
    declare(&ops, "busy", workers(1), ttl).await;
    let (brief, busy) = (client(&c, Some("brief")), client(&c, Some("busy")));
    for cl in [&brief, &busy] {
        cl.register_task(&task(0), 1).await.expect("register");
    }
    brief.reset_task(&task(0)).await.expect("reset");
    let started = tokio::time::Instant::now();
    loop {
        let names: Vec<String> = ops
            .list_namespaces()
            .await
            .expect("list")
            .into_iter()
            .map(|r| r.name)
            .collect();
        if !names.iter().any(|n| n == "brief") {
            assert!(names.iter().any(|n| n == "busy"), "{names:?}");
            break;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "brief outlived its TTL: {names:?}"
        );
        // The connected task keeps its namespace (heartbeats are not commands).
        busy.heartbeat(&task(0), 1).await.expect("heartbeat");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(1_400));
    let err = brief.get("k").await.expect_err("gone");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
}

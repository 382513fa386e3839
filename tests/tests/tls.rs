//! TLS: an ensemble whose gRPC ports speak TLS only, its replicas authenticating each other with
//! certificates of the ensemble's CA, and callers held to the identity their certificate names.
//!
//! Real processes on loopback, certificates made by the test's own CA (`coord_tests::certs`).

use std::time::Duration;

use coord_agent::{Agent, AgentConfig, ClientOptions, CoordClient};
use coord_proto::coord::raft::raft_transport_client::RaftTransportClient;
use coord_proto::coord::raft::RaftRequest;
use coord_proto::tensorflow as tf;
use coord_proto::tls::{ClientTls, Identity};
use coord_proto::xla::coordination as xla;
use coord_tests::certs::TestPki;
use coord_tests::cli::coordctl;
use coord_tests::cluster::{Cluster, ClusterOptions};
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(60);

async fn tls_cluster(extra: &[&str]) -> Cluster {
    let mut c = Cluster::start(ClusterOptions {
        tls: true,
        extra_args: extra.iter().map(|s| s.to_string()).collect(),
        ..ClusterOptions::default()
    });
    c.wait_for_leader(TIMEOUT).await;
    c
}

/// A client of `endpoints` over `tls` that gives up after `patience`.
fn client_of(endpoints: Vec<String>, tls: ClientTls, patience: Duration) -> CoordClient {
    let mut options = ClientOptions::new(endpoints);
    options.tls = Some(tls);
    options.unavailable_after = patience;
    CoordClient::new(options).expect("client")
}

fn task(job: &str, id: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: job.into(),
        task_id: id,
        recoverable: false,
    }
}

fn assert_denied(err: &tonic::Status, words: &[&str]) {
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    for w in words {
        assert!(err.message().contains(w), "{w:?} not in {err:?}");
    }
}

// The Raft links' and pre-appends' TLS (`link_tls`).
#[path = "tls/links.rs"]
mod links;

// Certificates rotated with SIGHUP.
#[path = "tls/rotation.rs"]
mod rotation;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_ensemble_serves_through_every_replica_and_survives_a_leader_kill() {
    let mut c = tls_cluster(&[]).await;
    let ops = c.pki().client_identity("ops");
    let tls = c.pki().client(Some(&ops));
    // Writes through each replica alone (followers forward to the leader over TLS), reads
    // through the others.
    for r in c.ids() {
        let one = client_of(vec![c.replica(r).grpc.to_string()], tls.clone(), TIMEOUT);
        one.insert(&format!("via/{r}"), "v", false)
            .await
            .unwrap_or_else(|e| panic!("insert through replica {r}: {e:?}"));
    }
    for r in c.ids() {
        let one = client_of(vec![c.replica(r).grpc.to_string()], tls.clone(), TIMEOUT);
        assert_eq!(one.get_dir("via").await.expect("read").len(), 3);
    }
    // The leader dies; a new one is elected over TLS and the writes go on; the old one comes
    // back, reconnects to its peers and catches up.
    let all = client_of(c.endpoints(), tls, TIMEOUT);
    let leader = c.wait_for_leader(TIMEOUT).await;
    c.kill(leader);
    for i in 0..20 {
        all.insert(&format!("after/{i}"), "v", false)
            .await
            .expect("insert after the leader's death");
    }
    let new_leader = c.wait_for_leader(TIMEOUT).await;
    assert_ne!(new_leader, leader);
    c.spawn(leader);
    let target = c.status(new_leader).expect("leader status").last_applied;
    c.wait_applied(leader, target, TIMEOUT).await;
    assert_eq!(all.get_dir("after").await.expect("read").len(), 20);
    // Over TLS too, AppendEntries take the links and lone writes are sent ahead (`link_tls`).
    let sent_ahead = c.metric(new_leader, "coord_pre_appends_sent_total");
    let link_calls = c.metric(new_leader, "coord_raft_link_calls_total");
    assert!(
        link_calls >= 20.0,
        "{link_calls} AppendEntries over links for 20 writes"
    );
    assert!(sent_ahead >= 1.0, "no lone write was sent ahead over TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_of_another_ca_are_refused_on_both_sides() {
    let c = tls_cluster(&[]).await;
    let endpoint = vec![c.replica(1).grpc.to_string()];
    let stranger = TestPki::new(&c.root().join("stranger"), "coord", &[]);
    let ops = c.pki().client_identity("ops");
    let patience = Duration::from_secs(2);

    // A client that trusts another CA refuses the replica's certificate.
    let err = client_of(endpoint.clone(), stranger.client(None), patience)
        .try_get("k")
        .await
        .expect_err("a server of an unknown CA was trusted");
    assert!(
        err.message().contains("invalid peer certificate"),
        "{err:?}"
    );
    // A client presenting a certificate of another CA is refused at the handshake, and what it
    // sent is not applied.
    let forged = ClientTls::load(
        &c.pki().ca_path(),
        Some(&stranger.issue(&ops).cert),
        Some(&stranger.dir().join("client-ops.key")),
        None,
    )
    .expect("tls");
    let err = client_of(endpoint.clone(), forged, patience)
        .insert("forged", "v", false)
        .await
        .expect_err("a certificate of another CA was accepted");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // A plain-gRPC client gets nowhere either.
    let mut plain = ClientOptions::new(endpoint.clone());
    plain.unavailable_after = patience;
    let err = CoordClient::new(plain)
        .expect("client")
        .try_get("k")
        .await
        .expect_err("plain gRPC was served");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let good = client_of(endpoint, c.pki().client(Some(&ops)), TIMEOUT);
    assert_eq!(good.try_get("forged").await.expect("read"), None);
    assert!(
        c.log(1).contains("invalid peer certificate"),
        "the replica did not log the refused handshake:\n{}",
        c.log(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_traffic_is_accepted_only_from_replicas_of_the_ensemble() {
    let mut c = tls_cluster(&[]).await;
    let pki = c.pki();
    let addr = c.replica(1).grpc.to_string();
    let other_ensemble = Identity::Replica {
        cluster: "other".into(),
        id: 2,
    };
    for (who, identity, words) in [
        (
            "a task",
            Some(pki.task("worker", 0)),
            vec!["only from replicas", "coord://coord/task/worker/0"],
        ),
        (
            "an operator",
            Some(pki.client_identity("ops")),
            vec!["only from replicas", "coord://coord/client/ops"],
        ),
        (
            "a replica of another ensemble",
            Some(other_ensemble),
            vec!["belongs to ensemble \"other\""],
        ),
        (
            "a caller without a certificate",
            None,
            vec!["only from replicas", "without a certificate"],
        ),
    ] {
        let channel = coord_proto::tls::endpoint(&addr, Some(&pki.client(identity.as_ref())))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let err = RaftTransportClient::new(channel)
            .vote(RaftRequest {
                cluster_id: 0,
                payload: Default::default(),
            })
            .await
            .expect_err(who);
        assert_denied(&err, &words);
    }
    // A replica started with another replica's certificate refuses to start.
    let mut args = c.args_of(3);
    let cert = args
        .iter()
        .position(|a| a == "--tls-cert")
        .expect("--tls-cert");
    args[cert + 1] = pki.dir().join("replica-1.crt").display().to_string();
    args[cert + 3] = pki.dir().join("replica-1.key").display().to_string();
    c.kill(3);
    c.spawn_with(3, &args);
    let code = c.wait_exit(3, TIMEOUT);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    assert!(
        c.log(3)
            .contains("is the certificate of coord://coord/replica/1, not of this replica"),
        "{}",
        c.log(3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_certificate_of_another_ca_cannot_take_part() {
    let mut c = tls_cluster(&[]).await;
    let ops = c.pki().client_identity("ops");
    let all = client_of(c.endpoints(), c.pki().client(Some(&ops)), TIMEOUT);
    all.insert("before", "v", false).await.expect("insert");
    let leader = c.wait_for_leader(TIMEOUT).await;
    let outsider = c.other_than(leader);
    c.kill(outsider);
    // Same identity, same flags, but signed by another CA (and trusting it).
    let stranger = TestPki::new(&c.root().join("stranger"), "coord", &[outsider]);
    let mut args = c.args_of(outsider);
    for (flag, file) in [
        ("--tls-cert", format!("replica-{outsider}.crt")),
        ("--tls-key", format!("replica-{outsider}.key")),
        ("--tls-ca", "ca.crt".to_string()),
    ] {
        let i = args.iter().position(|a| a == flag).expect(flag);
        args[i + 1] = stranger.dir().join(file).display().to_string();
    }
    c.spawn_with(outsider, &args);
    c.wait_serving(outsider, TIMEOUT).await;
    let before = c.status(outsider).expect("status").last_applied;
    for i in 0..50 {
        all.insert(&format!("while/{i}"), "v", false)
            .await
            .expect("the other two keep serving");
    }
    let leader_applied = c.status(leader).expect("status").last_applied;
    // Give the outsider every chance to hear of the new entries (it cannot).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < deadline {
        let s = c.status(outsider).expect("status");
        assert_eq!(
            s.last_applied, before,
            "the outsider applied entries: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(leader_applied > before);
    assert!(
        c.log(leader).contains("invalid peer certificate"),
        "the leader did not log the outsider's refused handshakes:\n{}",
        c.log(leader)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_may_act_only_as_itself() {
    let mut c = tls_cluster(&["--job", "worker=2", "--heartbeat-timeout-ms", "60000"]).await;
    let leader = c.wait_for_leader(TIMEOUT).await;
    let follower = c.other_than(leader);
    let pki = c.pki();
    let worker0 = pki.task("worker", 0);
    let tls0 = pki.client(Some(&worker0));
    let ops = pki.client_identity("ops");
    let operator = client_of(c.endpoints(), pki.client(Some(&ops)), TIMEOUT);

    // Worker 0's agent, with its own certificate, registers and heartbeats as itself.
    let mut config = AgentConfig::new(c.endpoints(), "worker", 0);
    config.tls = Some(tls0.clone());
    let agent = Agent::new(config, |_| {}).expect("agent");
    agent.connect().await.expect("worker 0 registers as itself");

    // With the same certificate, acting as worker 1 is refused, through the leader and through
    // a follower alike.
    let w1 = task("worker", 1);
    for r in [leader, follower] {
        let as0 = client_of(vec![c.replica(r).grpc.to_string()], tls0.clone(), TIMEOUT);
        let words = ["task worker/1", "task worker/0's"];
        let err = as0.register_task(&w1, 7).await.expect_err("register");
        assert_denied(&err, &words);
        assert!(err.message().contains("RegisterTask"), "{err:?}");
        assert_denied(&as0.heartbeat(&w1, 7).await.expect_err("hb"), &words);
        let err = as0.report_error(&w1, 13, "forged").await.expect_err("e");
        assert_denied(&err, &["ReportErrorToService", "error_origin"]);
        let err = as0.barrier("b", 0, TIMEOUT, &[], &w1).await.expect_err("b");
        assert_denied(&err, &words);
        assert_denied(&as0.reset_task(&w1).await.expect_err("reset"), &words);
        assert_denied(&as0.poll_for_error(&w1, 0).await.expect_err("poll"), &words);
        // Over the XLA surface as well (its task ids name tasks of the first job).
        let channel = coord_proto::tls::endpoint(&c.replica(r).grpc.to_string(), Some(&tls0))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let err = coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient::new(channel)
            .register_task(coord_proto::xla::coordination::RegisterTaskRequest {
                source_task_id: 1,
                ..Default::default()
            })
            .await
            .expect_err("xla register");
        assert_denied(
            &err,
            &["xla/RegisterTask", "source_task_id", "task worker/1"],
        );
        // With XLA's error payload: without it jaxlib takes the refusal for a lost connection.
        let details: coord_proto::tensorflow::distributed_runtime::GrpcPayloadContainer =
            prost::Message::decode(err.details()).expect("XLA error details");
        assert!(
            details
                .payloads
                .contains_key(coord_proto::tensorflow::distributed_runtime::COORDINATION_ERROR_URL),
            "{err:?}"
        );
        // Each arrival a sidecar sends with others is checked as the task's own call is.
        let arrival = |t| tf::BarrierRequest {
            barrier_id: "b".into(),
            source_task: Some(t),
            ..Default::default()
        };
        let both = vec![arrival(task("worker", 0)), arrival(w1.clone())];
        let err = as0.barrier_arrivals(both).await.expect_err("arrivals");
        assert_denied(&err, &["arrivals[1].source_task", "task worker/1"]);
        let a = xla::BarrierRequest {
            source_task_id: 1,
            ..Default::default()
        };
        let e = as0.xla_barrier_arrivals(vec![a]).await.expect_err("x");
        assert_denied(&e, &["arrivals[0].source_task_id", "task worker/1"]);
        let a = xla::GetAliveTasksRequest {
            requesting_task_id: 1,
            ..Default::default()
        };
        let e = as0
            .xla_alive_arrivals(vec![a.clone()])
            .await
            .expect_err("alive");
        assert_denied(&e, &["arrivals[0].requesting_task_id", "task worker/1"]);
        let asks = coord_proto::coord::coordination::XlaAliveAsksRequest {
            sets: vec![Default::default()],
            asks: vec![
                xla::GetAliveTasksRequest {
                    requesting_task_id: 0,
                    ..Default::default()
                },
                a,
            ],
            set: vec![0, 0],
            ask_seqs: vec![],
        };
        let e = as0.xla_alive_asks(asks).await.expect_err("asks");
        assert_denied(&e, &["asks[1].requesting_task_id", "task worker/1"]);
        // A task may not reconfigure the ensemble.
        let err = as0.remove_member(3).await.expect_err("member remove");
        assert_denied(&err, &["RemoveMember", "not allowed to a task"]);
    }
    // Nothing happened to worker 1, and no error was recorded.
    let states = operator
        .task_states(std::slice::from_ref(&w1))
        .await
        .expect("states");
    assert_eq!(states.tasks.len(), 1);
    assert_eq!(
        states.tasks[0].state,
        tf::CoordinatedTaskState::TaskstateDisconnected as i32,
        "{states:?}"
    );
    assert!(operator.members().await.expect("members").len() == 3);
    // Worker 0 is unharmed, and an operator's certificate may act for any task.
    let states = operator
        .task_states(&[task("worker", 0)])
        .await
        .expect("states");
    assert_eq!(
        states.tasks[0].state,
        tf::CoordinatedTaskState::TaskstateConnected as i32,
        "{states:?}"
    );
    assert_eq!(agent.state(), coord_agent::AgentState::Running);
    assert!(agent.error().is_none(), "{:?}", agent.error());
    operator
        .register_task(&w1, 9)
        .await
        .expect("an operator registers worker 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_client_certificates_and_the_forwarded_mark() {
    let c = tls_cluster(&[
        "--tls-client-auth",
        "require",
        "--max-requests-per-second-per-client",
        "20",
    ])
    .await;
    let pki = c.pki();
    let endpoint = vec![c.replica(1).grpc.to_string()];
    let patience = Duration::from_secs(2);
    // Without a certificate: refused at the handshake.
    let err = client_of(endpoint.clone(), pki.client(None), patience)
        .try_get("k")
        .await
        .expect_err("a client without a certificate was served");
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    // coordctl with an operator's certificate is served; without one it is not.
    let ops = pki.client_identity("ops");
    let files = pki.issue(&ops);
    let ca = pki.ca_path().display().to_string();
    let (cert, key) = (
        files.cert.display().to_string(),
        files.key.display().to_string(),
    );
    let tls_flags = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    let mut args = tls_flags.to_vec();
    args.extend(["kv", "put", "from/coordctl", "yes"]);
    let out = coordctl(&c.endpoints(), &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = coordctl(
        &c.endpoints(),
        &[
            "--timeout-secs",
            "2",
            "--tls-ca",
            &ca,
            "kv",
            "get",
            "from/coordctl",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A task marking its calls as forwarded by a replica is still held to the rate limit (over
    // TLS the mark counts only from a replica's certificate).
    let tls = pki.client(Some(&pki.task("worker", 0)));
    let channel = coord_proto::tls::endpoint(&endpoint[0], Some(&tls))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut raw = tf::coordination_service_client::CoordinationServiceClient::new(channel);
    let mut refused = None;
    for i in 0..200 {
        let mut req = tonic::Request::new(tf::TryGetKeyValueRequest {
            key: format!("k/{i}"),
        });
        req.metadata_mut().insert(
            coord_proto::metadata::FORWARDED,
            "2".parse().expect("value"),
        );
        if let Err(e) = raw.try_get_key_value(req).await {
            if e.code() != Code::NotFound {
                refused = Some(e);
                break;
            }
        }
    }
    let err = refused.expect("200 calls marked as forwarded escaped a 20/s limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
}

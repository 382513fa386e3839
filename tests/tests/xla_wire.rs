//! The XLA surface at the wire, where jaxlib's Python API (0.10 and 0.12 alike) does not reach:
//! error payloads, the service-incarnation check, WatchTasks, ReportErrorToService, gzip, bad task
//! ids, GetAliveTasks through a follower. (tests/tests/jax.rs runs the real client.)

use std::time::Duration;

use coord_proto::tensorflow::distributed_runtime::GrpcPayloadContainer;
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient;
use coord_tests::{Cluster, ClusterOptions};
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;
use tonic::{Code, Status};

#[path = "xla_wire/alive.rs"]
mod alive;

type Client = CoordinationServiceClient<Channel>;

async fn client(addr: std::net::SocketAddr) -> Client {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    CoordinationServiceClient::new(ch).send_compressed(CompressionEncoding::Gzip)
}

/// The payloads of an error, by type URL.
fn payloads(s: &Status) -> GrpcPayloadContainer {
    GrpcPayloadContainer::decode(s.details())
        .expect("grpc-status-details-bin is a GrpcPayloadContainer")
}

fn payload<M: Message + Default>(s: &Status, name: &str) -> M {
    let p = payloads(s);
    let url = format!("type.googleapis.com/tensorflow.{name}");
    let bytes = p
        .payloads
        .get(&url)
        .unwrap_or_else(|| panic!("no {url} in the error {s:?}"));
    M::decode(bytes.as_ref()).expect("payload decodes")
}

fn incarnations(task: i32, service: u64) -> Option<xla::Incarnations> {
    Some(xla::Incarnations {
        task_id: task,
        task_incarnation: 0,
        service_incarnation: service,
    })
}

/// Asserts that arrival `i`'s answer carries exactly the error of the task's own call: code,
/// message and payloads.
fn same_error(i: usize, a: &coord_proto::coord::coordination::BarrierAnswer, own: &Status) {
    assert_eq!(
        a.error_code,
        own.code() as i32,
        "arrival {i}: {a:?} / {own:?}"
    );
    assert_eq!(a.error_message, own.message(), "arrival {i}");
    let theirs = Status::with_details(own.code(), "", a.error_details.clone());
    assert_eq!(
        payloads(&theirs),
        payloads(own),
        "arrival {i}: the payloads of the task's own call"
    );
}

struct Env {
    cluster: Cluster,
    clients: Vec<Client>,
}

/// Three replicas serving job `jax` of 2 tasks (XLA ids 0 and 1); task `i` talks to replica
/// `i % 3`, so forwarding is on the path.
async fn env() -> Env {
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: [
            "--job",
            "jax=2",
            "--job",
            "other=1",
            "--xla-job",
            "jax",
            "--heartbeat-timeout-ms",
            "120000",
        ]
        .map(String::from)
        .into(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let mut clients = Vec::new();
    for r in &cluster.replicas {
        clients.push(client(r.grpc).await);
    }
    Env { cluster, clients }
}

/// Registers both tasks (RegisterTask waits at the register barrier, so both at once); returns
/// the service incarnation.
async fn register_both(env: &Env) -> u64 {
    let calls = (0..2).map(|t| {
        let mut c = env.clients[t as usize].clone();
        async move {
            c.register_task(xla::RegisterTaskRequest {
                incarnation: 100 + t as u64,
                source_task_id: t,
            })
            .await
            .expect("register")
            .into_inner()
            .service_incarnation
        }
    });
    let got = futures::future::join_all(calls).await;
    assert_eq!(got[0], got[1], "one service incarnation");
    assert_ne!(got[0], 0);
    got[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_xla_payloads() {
    let env = env().await;
    let service = register_both(&env).await;
    let mut c0 = env.clients[0].clone();

    // A stale service incarnation: INTERNAL, with the service's real one in the payload.
    let err = c0
        .insert_key_value(xla::InsertKeyValueRequest {
            incarnations: incarnations(0, service ^ 1),
            kv: Some(xla::KeyValueEntry {
                key: "a".into(),
                value: "1".into(),
            }),
            allow_overwrite: false,
        })
        .await
        .expect_err("wrong incarnation");
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message().contains("wrong service incarnation"),
        "{err:?}"
    );
    let m: xla::ServiceMismatchError = payload(&err, "ServiceMismatchError");
    assert_eq!(m.service_incarnation, service);
    let _: xla::CoordinationServiceError = payload(&err, "CoordinationServiceError");
    // ... and it changed nothing.
    let err = c0
        .try_get_key_value(xla::TryGetKeyValueRequest {
            incarnations: incarnations(0, service),
            key: "a".into(),
        })
        .await
        .expect_err("nothing was written");
    assert_eq!(err.code(), Code::NotFound);
    let _: xla::CoordinationServiceError = payload(&err, "CoordinationServiceError");

    // A barrier error names the barrier and its instance.
    let err = c0
        .barrier(xla::BarrierRequest {
            incarnations: incarnations(0, service),
            barrier_id: "b".into(),
            barrier_timeout_in_ms: 200,
            task_ids: vec![0, 1],
            source_task_id: 0,
            counter: 0,
        })
        .await
        .expect_err("task 1 never comes");
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    let b: xla::BarrierError = payload(&err, "BarrierError");
    assert_eq!((b.barrier_id.as_str(), b.counter), ("b", 0));

    // XLA ids name tasks of --xla-job only.
    let err = c0
        .barrier(xla::BarrierRequest {
            incarnations: incarnations(0, service),
            barrier_id: "c".into(),
            barrier_timeout_in_ms: 1000,
            task_ids: vec![0, 7],
            source_task_id: 0,
            counter: 0,
        })
        .await
        .expect_err("task 7 does not exist");
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("task 7"), "{err:?}");

    // Increments are decimal, and a non-number is refused by name.
    let r = c0
        .increment_key_value(xla::IncrementKeyValueRequest {
            incarnations: incarnations(0, service),
            key: "//n//".into(),
            increment: 41,
        })
        .await
        .expect("increment")
        .into_inner();
    let kv = r.kv.expect("kv");
    assert_eq!(
        (kv.key.as_str(), kv.value.as_ref()),
        ("n", b"41".as_slice())
    );
    c0.insert_key_value(xla::InsertKeyValueRequest {
        incarnations: incarnations(0, service),
        kv: Some(xla::KeyValueEntry {
            key: "word".into(),
            value: "abc".into(),
        }),
        allow_overwrite: false,
    })
    .await
    .expect("insert");
    let err = c0
        .increment_key_value(xla::IncrementKeyValueRequest {
            incarnations: incarnations(0, service),
            key: "word".into(),
            increment: 1,
        })
        .await
        .expect_err("not a number");
    assert!(err.message().contains("\"word\""), "{err:?}");
    let _: xla::CoordinationServiceError = payload(&err, "CoordinationServiceError");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_errors_reach_pollers_and_watchers() {
    let env = env().await;
    let service = register_both(&env).await;
    let mut c0 = env.clients[0].clone();
    let mut c1 = env.clients[1].clone();

    let watched = c0
        .watch_tasks(xla::WatchTasksRequest {
            incarnations: incarnations(0, service),
            version_number: -1,
        })
        .await
        .expect("watch")
        .into_inner();
    assert_eq!(watched.task_state.len(), 2);
    assert!(watched
        .task_state
        .iter()
        .all(|t| t.state == xla::TaskState::TaskstateConnected as i32));

    // Task 1 polls for errors; a watch at the current version waits for a change.
    let poll = tokio::spawn(async move {
        c1.poll_for_error(xla::PollForErrorRequest {
            incarnations: incarnations(1, service),
            source_task_id: 1,
        })
        .await
    });
    let mut w = c0.clone();
    let version = watched.version_number;
    let watch = tokio::spawn(async move {
        w.watch_tasks(xla::WatchTasksRequest {
            incarnations: incarnations(0, service),
            version_number: version,
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !poll.is_finished() && !watch.is_finished(),
        "nothing happened yet"
    );

    c0.report_error_to_service(xla::ReportErrorToServiceRequest {
        incarnations: incarnations(0, service),
        source_task_id: 0,
        error_code: Code::DataLoss as i32,
        error_message: "disk on fire".into(),
    })
    .await
    .expect("report");

    let err = tokio::time::timeout(Duration::from_secs(30), poll)
        .await
        .expect("the poll ends")
        .expect("join")
        .expect_err("an error is the poll's answer");
    assert_eq!(err.code(), Code::DataLoss, "{err:?}");
    assert!(err.message().contains("disk on fire"), "{err:?}");
    let e: xla::CoordinationServiceError = payload(&err, "CoordinationServiceError");
    assert!(e.is_reported_error);
    assert_eq!(e.source_task_id, 0);

    let changed = tokio::time::timeout(Duration::from_secs(30), watch)
        .await
        .expect("the watch ends")
        .expect("join")
        .expect("watch")
        .into_inner();
    assert!(changed.version_number > version);
    let t0 = changed
        .task_state
        .iter()
        .find(|t| t.task_id == 0)
        .expect("task 0");
    assert_eq!(t0.state, xla::TaskState::TaskstateError as i32);
    assert_eq!(t0.incarnation, 100);
    assert_eq!(t0.error_code, Code::DataLoss as i32);
    drop(env.cluster);
}

/// GetAliveTasks is routed as runs of task numbers: asked through a follower and through the
/// leader, in any order and with repeats, it answers the live tasks in task order; a task id not
/// of the job is refused by name, through either. The follower records each call's ask on the
/// leader and waits on the round there once for all its callers of it; an ask the leader refuses
/// (a stale service incarnation) ends with the error of the call through the leader, code,
/// message and payloads alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_alive_tasks_answers_through_follower_and_leader() {
    let mut env = env().await;
    let service = register_both(&env).await;
    let leader = env.cluster.wait_for_leader(Duration::from_secs(30)).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let via_leader = client(env.cluster.replica(leader).grpc).await;
    let via_follower = client(env.cluster.replica(follower).grpc).await;

    let ask = |mut c: Client, task: i32, task_ids: Vec<i32>| async move {
        c.get_alive_tasks(xla::GetAliveTasksRequest {
            incarnations: incarnations(task, service),
            requesting_task_id: task,
            task_ids,
        })
        .await
    };
    let (a0, a1) = tokio::join!(
        ask(via_follower.clone(), 0, vec![1, 0, 1]),
        ask(via_leader.clone(), 1, vec![0, 1]),
    );
    for (task, answer) in [(0, a0), (1, a1)] {
        let answer = answer
            .unwrap_or_else(|e| panic!("task {task} asked: {e:?}"))
            .into_inner();
        assert_eq!(answer.alive_task_ids, vec![0, 1], "task {task}");
        assert_eq!(answer.incarnations, vec![100, 101], "task {task}");
    }

    // A second round, both tasks through the follower: one wait on the leader for the two (or a
    // second, answered at once, when the first caller had its answer before the second looked).
    let waits = || env.cluster.metric(follower, "coord_relayed_waits_total");
    let waits_before = waits();
    let (a0, a1) = tokio::join!(
        ask(via_follower.clone(), 0, vec![0, 1]),
        ask(via_follower.clone(), 1, vec![1, 0]),
    );
    for (task, answer) in [(0, a0), (1, a1)] {
        let answer = answer
            .unwrap_or_else(|e| panic!("task {task} asked again: {e:?}"))
            .into_inner();
        assert_eq!(answer.alive_task_ids, vec![0, 1], "task {task}, round 2");
        assert_eq!(answer.incarnations, vec![100, 101], "task {task}, round 2");
    }
    let sent = waits() - waits_before;
    assert!(
        (1.0..=2.0).contains(&sent),
        "the follower waited on round 2 on the leader {sent} times for its 2 callers"
    );
    assert_eq!(
        env.cluster.metric(follower, "coord_relayed_waiting_calls"),
        0.0
    );

    let stale = |mut c: Client| async move {
        c.get_alive_tasks(xla::GetAliveTasksRequest {
            incarnations: incarnations(0, service ^ 1),
            requesting_task_id: 0,
            task_ids: vec![0, 1],
        })
        .await
        .expect_err("a stale service incarnation")
    };
    let (through_follower, through_leader) = (
        stale(via_follower.clone()).await,
        stale(via_leader.clone()).await,
    );
    assert_eq!(
        through_follower.code(),
        through_leader.code(),
        "{through_follower:?}"
    );
    assert_eq!(through_follower.message(), through_leader.message());
    assert_eq!(payloads(&through_follower), payloads(&through_leader));

    for c in [via_follower, via_leader] {
        let err = ask(c, 0, vec![0, 9])
            .await
            .expect_err("task 9 is not of the job");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains("task 9"), "{err:?}");
        let _: xla::CoordinationServiceError = payload(&err, "CoordinationServiceError");
    }
    drop(env.cluster);
}

/// jaxlib's Barrier arrivals recorded together (`coordination/XlaBarrierArrivals`, what a
/// coord-proxy sidecar sends): each answered as the task's own Barrier call is, code, message and
/// payloads alike; pending ones until their instance passes; at most 65,536 in one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barrier_arrivals_are_answered_as_the_tasks_own_calls() {
    let env = env().await;
    let service = register_both(&env).await;
    let c = coord_agent::CoordClient::new(coord_agent::ClientOptions::new(env.cluster.endpoints()))
        .expect("client");
    let arrival = |task: i32, id: &str, task_ids: Vec<i32>, service: u64| xla::BarrierRequest {
        incarnations: incarnations(task, service),
        barrier_id: id.into(),
        barrier_timeout_in_ms: 20_000,
        task_ids,
        source_task_id: task,
        counter: 0,
    };
    // Wrong arrivals beside a good one (at a barrier of the XLA job's two tasks; the ensemble has
    // another job): a stale incarnation, a task not of the job, a participant not of the job, no
    // barrier id.
    let wrong = vec![
        arrival(0, "w1", vec![], service ^ 1),
        arrival(7, "w2", vec![], service),
        arrival(0, "w3", vec![0, 9], service),
        arrival(1, "", vec![], service),
    ];
    let mut sent = wrong.clone();
    sent.push(arrival(0, "step", vec![0, 1], service));
    let answers = c.xla_barrier_arrivals(sent).await.expect("arrivals");
    assert_eq!(answers.len(), wrong.len() + 1, "one answer per arrival");
    let pending = answers.last().expect("the good one");
    assert!(pending.pending && pending.counter == 0, "{pending:?}");
    for (i, (a, req)) in answers.iter().zip(wrong).enumerate() {
        assert!(!a.pending && a.error_code != 0, "arrival {i}: {a:?}");
        let own = env.clients[0]
            .clone()
            .barrier(req)
            .await
            .expect_err("the task's own call fails");
        same_error(i, a, &own);
    }
    // The last task arrives: the instance passes, for the waiter too.
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move { c.await_barrier("step", 0).await })
    };
    let last = c
        .xla_barrier_arrivals(vec![arrival(1, "step", vec![0, 1], service)])
        .await
        .expect("last");
    assert!(!last[0].pending && last[0].error_code == 0, "{last:?}");
    let passed = waiting.await.expect("join").expect("await");
    assert!(!passed.pending && passed.error_code == 0, "{passed:?}");

    let err = c
        .xla_barrier_arrivals(vec![arrival(0, "x", vec![], service); 65_537])
        .await
        .expect_err("over the limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("65536"), "{err:?}");
}

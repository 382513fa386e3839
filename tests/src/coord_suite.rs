//! The coordination service's behaviour suite, written once and run against ensembles of
//! different sizes ([`coordination_suite!`] instantiates it).
//!
//! Each check starts its own ensemble with the job configuration it needs, talks to it through
//! `CoordClient` (all replicas, leader-following), and asserts outcomes and exact gRPC codes.

use std::time::{Duration, Instant};

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use tonic::Code;

use crate::cluster::{Cluster, ClusterOptions};

pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// An ensemble and a client of it.
pub struct Env {
    pub cluster: Cluster,
    pub client: CoordClient,
}

impl Env {
    /// Starts `replicas` replicas with `flags` (the job configuration) and waits for a leader.
    pub async fn start(replicas: usize, flags: &[&str]) -> Env {
        let mut cluster = Cluster::start(ClusterOptions {
            replicas,
            extra_args: flags.iter().map(|s| s.to_string()).collect(),
            ..ClusterOptions::default()
        });
        cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let client = CoordClient::new(ClientOptions::new(cluster.endpoints())).expect("client");
        client.find_leader().await;
        Env { cluster, client }
    }

    /// Waits (with a deadline) until at least `n` calls are parked on the ensemble, i.e. the calls
    /// started before are waiting on the leader.
    pub async fn wait_parked(&mut self, n: u64) {
        self.wait_metric("coord_parked_calls", n).await;
    }

    /// Waits (with a deadline) until at least `n` key watches are being served.
    pub async fn wait_watches(&mut self, n: u64) {
        self.wait_metric("coord_active_watches", n).await;
    }

    /// Waits until the gauge `name`, summed over the replicas, reaches `n`.
    async fn wait_metric(&mut self, name: &str, n: u64) {
        let prefix = format!("{name} ");
        self.cluster
            .wait_until(LEADER_TIMEOUT, &format!("{name} >= {n}"), |c| {
                let total: u64 = c
                    .ids()
                    .iter()
                    .filter_map(|&id| crate::http::get(c.replica(id).http, "/metrics").ok())
                    .filter_map(|(_, m)| {
                        m.lines()
                            .find_map(|l| l.strip_prefix(prefix.as_str()))
                            .and_then(|v| v.trim().parse::<f64>().ok())
                    })
                    .map(|v| v as u64)
                    .sum();
                total >= n
            })
            .await;
    }

    /// Another client with its own connections (a different agent).
    pub fn another_client(&self) -> CoordClient {
        CoordClient::new(ClientOptions::new(self.cluster.endpoints())).expect("client")
    }
}

pub fn task(job: &str, id: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: job.into(),
        task_id: id,
    }
}

pub fn w(id: i32) -> tf::CoordinatedTask {
    task("worker", id)
}

/// Asserts an error with `code` whose message contains `needle`.
pub fn assert_code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, needle: &str) {
    match r {
        Ok(v) => panic!("expected {code:?} mentioning {needle:?}, got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert!(
                s.message().contains(needle),
                "message {:?} should mention {needle:?}",
                s.message()
            );
        }
    }
}

async fn state_of(c: &CoordClient, t: &tf::CoordinatedTask) -> tf::CoordinatedTaskState {
    let resp = c
        .task_states(std::slice::from_ref(t))
        .await
        .expect("task states");
    tf::CoordinatedTaskState::try_from(resp.tasks[0].state).expect("state")
}

async fn register_all(c: &CoordClient, n: i32) -> u64 {
    let mut incarnation = 0;
    for i in 0..n {
        incarnation = c
            .register_task(&w(i), 100 + i as u64)
            .await
            .expect("register");
    }
    incarnation
}

fn tf_devices(name: &str) -> tf::CoordinationServiceDeviceInfo {
    tf::CoordinationServiceDeviceInfo {
        r#type: Some(tf::coordination_service_device_info::Type::Tf(
            tf::TfDeviceList {
                devices: vec![bytes::Bytes::from(name.to_string())],
            },
        )),
    }
}

pub async fn register_and_wait_for_all_tasks(replicas: usize) {
    let env = Env::start(replicas, &["--job", "worker=3"]).await;
    let c = &env.client.clone();
    let incarnation = register_all(c, 3).await;
    assert_ne!(incarnation, 0);
    let waits: Vec<_> = (0..3)
        .map(|i| {
            let c = env.another_client();
            tokio::spawn(async move {
                c.wait_for_all_tasks(&w(i), Some(tf_devices(&format!("dev{i}"))))
                    .await
            })
        })
        .collect();
    for wait in waits {
        let resp = wait.await.expect("join").expect("wait for all");
        assert_eq!(resp.leader_incarnation, incarnation);
        match resp.cluster_device_info.and_then(|d| d.r#type) {
            Some(tf::coordination_service_device_info::Type::Tf(list)) => {
                let names: Vec<_> = list
                    .devices
                    .iter()
                    .map(|d| String::from_utf8_lossy(d).to_string())
                    .collect();
                assert_eq!(
                    names,
                    ["dev0", "dev1", "dev2"],
                    "every task's devices, in task order"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // Every replica reports the same service incarnation.
    assert_eq!(
        c.heartbeat(&w(0), 100).await.expect("heartbeat"),
        incarnation
    );
}

pub async fn registration_rules(replicas: usize) {
    let env = Env::start(
        replicas,
        &[
            "--job",
            "worker=2",
            "--job",
            "eval=1",
            "--recoverable-job",
            "eval",
        ],
    )
    .await;
    let c = &env.client.clone();
    c.register_task(&w(0), 7).await.expect("register");
    c.register_task(&w(0), 7)
        .await
        .expect("same incarnation again is fine");
    assert_code(
        c.register_task(&task("ps", 0), 1).await,
        Code::InvalidArgument,
        "job \"ps\" is not in the cluster",
    );
    assert_code(
        c.register_task(&w(2), 1).await,
        Code::InvalidArgument,
        "tasks 0..1",
    );
    assert_code(
        c.register_task(&w(-1), 1).await,
        Code::InvalidArgument,
        "negative",
    );
    c.register_task(&w(1), 1).await.expect("register");
    // w0 restarted: a new incarnation of a connected task.
    assert_code(c.register_task(&w(0), 8).await, Code::Aborted, "restarted");
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateError
    );
    let err = tokio::time::timeout(Duration::from_secs(5), c.poll_for_error(&w(1), 0))
        .await
        .expect("w1 learns of the error")
        .expect("poll");
    assert_eq!(err.error_payload.and_then(|p| p.source_task), Some(w(0)));
    assert_code(c.register_task(&w(0), 8).await, Code::Aborted, "reset it");
    c.reset_task(&w(0)).await.expect("reset");
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateDisconnected
    );
    c.register_task(&w(0), 8)
        .await
        .expect("registers again after reset");
    c.reset_task(&w(1))
        .await
        .expect("a connected task can be reset (disconnected)");
    assert_code(
        c.reset_task(&w(1)).await,
        Code::FailedPrecondition,
        "already disconnected",
    );
    // A recoverable task restarts freely and nobody is told.
    let eval = task("eval", 0);
    c.register_task(&eval, 1).await.expect("register");
    c.register_task(&eval, 2)
        .await
        .expect("a recoverable task may restart");
    assert_eq!(
        state_of(c, &eval).await,
        tf::CoordinatedTaskState::TaskstateConnected
    );
    let quiet =
        tokio::time::timeout(Duration::from_millis(500), c.poll_for_error(&w(1), err.seq)).await;
    assert!(
        quiet.is_err(),
        "a recoverable restart must not be propagated: {quiet:?}"
    );
    // Malformed requests.
    let missing =
        coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient::connect(
            format!("http://{}", env.cluster.endpoints()[0]),
        )
        .await
        .expect("connect")
        .register_task(tf::RegisterTaskRequest {
            incarnation: 1,
            source_task: None,
        })
        .await;
    assert_code(missing, Code::InvalidArgument, "source_task is missing");
}

pub async fn heartbeats_and_timeouts(replicas: usize) {
    let env = Env::start(
        replicas,
        &["--job", "worker=2", "--heartbeat-timeout-ms", "1500"],
    )
    .await;
    let c = &env.client.clone();
    assert_code(
        c.heartbeat(&w(0), 1).await,
        Code::FailedPrecondition,
        "not registered",
    );
    let incarnation = register_all(c, 2).await;
    assert_eq!(
        c.heartbeat(&w(0), 100).await.expect("heartbeat"),
        incarnation
    );
    assert_code(c.heartbeat(&w(0), 999).await, Code::Aborted, "restarted");
    assert_code(
        c.heartbeat(&w(5), 1).await,
        Code::InvalidArgument,
        "tasks 0..1",
    );
    // w1 keeps heartbeating, w0 falls silent.
    let beat = {
        let c = env.another_client();
        tokio::spawn(async move {
            loop {
                let _ = c.heartbeat(&w(1), 101).await;
                // The heartbeat interval, not a wait for a condition.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), c.poll_for_error(&w(1), 0))
        .await
        .expect("the silent task is detected")
        .expect("poll");
    beat.abort();
    assert_eq!(err.error_code, Code::Unavailable as i32);
    assert!(
        err.error_message.contains("no heartbeat"),
        "{}",
        err.error_message
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "detected before the timeout"
    );
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateError
    );
    assert_eq!(
        state_of(c, &w(1)).await,
        tf::CoordinatedTaskState::TaskstateConnected
    );
    // The task's error is the answer, not "try again": it comes back at once.
    let asked = Instant::now();
    assert_code(
        c.heartbeat(&w(0), 100).await,
        Code::Unavailable,
        "is in error state",
    );
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the error answer was retried for {:?}",
        asked.elapsed()
    );
}

pub async fn reported_errors_reach_every_task(replicas: usize) {
    let mut env = Env::start(replicas, &["--job", "worker=4"]).await;
    let c = &env.client.clone();
    register_all(c, 4).await;
    let polls: Vec<_> = (1..4)
        .map(|i| {
            let c = env.another_client();
            tokio::spawn(async move { (Instant::now(), c.poll_for_error(&w(i), 0).await) })
        })
        .collect();
    env.wait_parked(3).await;
    let reported_at = Instant::now();
    c.report_error(&w(0), Code::Internal as i32, "GPU fell off the bus")
        .await
        .expect("report");
    for p in polls {
        let (_, r) = p.await.expect("join");
        let e = r.expect("poll");
        let payload = e.error_payload.expect("payload");
        assert_eq!(payload.source_task, Some(w(0)));
        assert!(payload.is_reported_error);
        assert_eq!(e.error_code, Code::Internal as i32);
        assert!(e.error_message.contains("GPU fell off the bus"));
        assert!(
            reported_at.elapsed() < Duration::from_secs(1),
            "learned after {:?}",
            reported_at.elapsed()
        );
    }
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateError
    );
}

pub async fn barriers_pass_and_are_reused(replicas: usize) {
    let env = Env::start(replicas, &["--job", "worker=3"]).await;
    let c = &env.client.clone();
    register_all(c, 3).await;
    for counter in 0..2 {
        let arrivals: Vec<_> = (0..3)
            .map(|i| {
                let c = env.another_client();
                tokio::spawn(async move {
                    c.barrier("step", counter, Duration::from_secs(20), &[], &w(i))
                        .await
                })
            })
            .collect();
        for a in arrivals {
            assert_eq!(a.await.expect("join").expect("barrier"), counter);
        }
        // Later calls for a finished instance get its stored result at once.
        assert_eq!(
            c.barrier("step", counter, Duration::from_secs(1), &[], &w(1))
                .await
                .expect("again"),
            counter
        );
    }
    // A subset barrier.
    let pair = [w(0), w(2)];
    let a = {
        let c = env.another_client();
        tokio::spawn(async move {
            c.barrier("pair", 0, Duration::from_secs(20), &[w(0), w(2)], &w(0))
                .await
        })
    };
    c.barrier("pair", 0, Duration::from_secs(20), &pair, &w(2))
        .await
        .expect("pair");
    a.await.expect("join").expect("pair");
}

pub async fn barrier_failures(replicas: usize) {
    let mut env = Env::start(replicas, &["--job", "worker=3"]).await;
    let c = &env.client.clone();
    register_all(c, 3).await;
    let t = Duration::from_secs(20);
    // Timeout: the deadline is the first arrival's + its timeout.
    let started = Instant::now();
    assert_code(
        c.barrier("slow", 0, Duration::from_millis(700), &[], &w(0))
            .await,
        Code::DeadlineExceeded,
        "/job:worker/replica:0/task:1",
    );
    assert!(started.elapsed() >= Duration::from_millis(650));
    // Cancel: a waiting caller and later callers get CANCELLED.
    let waiting = {
        let c = env.another_client();
        tokio::spawn(async move { c.barrier("c", 0, Duration::from_secs(20), &[], &w(0)).await })
    };
    env.wait_parked(1).await;
    c.cancel_barrier("c", 0, &w(1)).await.expect("cancel");
    assert_code(
        waiting.await.expect("join"),
        Code::Cancelled,
        "cancelled by task /job:worker/replica:0/task:1",
    );
    assert_code(
        c.barrier("c", 0, t, &[], &w(2)).await,
        Code::Cancelled,
        "cancelled",
    );
    // The same answer through every replica (a follower forwards the call and must pass the
    // leader's CANCELLED on, not take it for a broken hop and retry).
    for id in env.cluster.ids() {
        let pinned = CoordClient::new(ClientOptions::new(vec![env
            .cluster
            .replica(id)
            .grpc
            .to_string()]))
        .expect("client");
        let name = format!("c{id}");
        let waiting = {
            let name = name.clone();
            tokio::spawn(async move {
                pinned
                    .barrier(&name, 0, Duration::from_secs(20), &[], &w(0))
                    .await
            })
        };
        env.wait_parked(1).await;
        c.cancel_barrier(&name, 0, &w(1)).await.expect("cancel");
        let started = Instant::now();
        assert_code(waiting.await.expect("join"), Code::Cancelled, "cancelled");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the answer was retried"
        );
    }
    // Cancelling a passed barrier.
    let pair = [w(0), w(1)];
    let a = {
        let c = env.another_client();
        tokio::spawn(async move {
            c.barrier("p", 0, Duration::from_secs(20), &[w(0), w(1)], &w(0))
                .await
        })
    };
    c.barrier("p", 0, t, &pair, &w(1)).await.expect("pass");
    a.await.expect("join").expect("pass");
    assert_code(
        c.cancel_barrier("p", 0, &w(0)).await,
        Code::FailedPrecondition,
        "already passed",
    );
    // Conflicting participant sets fail the barrier for everyone.
    let first = {
        let c = env.another_client();
        tokio::spawn(async move {
            c.barrier("x", 0, Duration::from_secs(20), &[w(0), w(1)], &w(0))
                .await
        })
    };
    env.wait_parked(1).await;
    assert_code(
        c.barrier("x", 0, t, &[], &w(1)).await,
        Code::InvalidArgument,
        "other participants",
    );
    assert_code(
        first.await.expect("join"),
        Code::InvalidArgument,
        "other participants",
    );
    // A participant outside the cluster; a caller outside the participants.
    assert_code(
        c.barrier("y", 0, t, &[w(0), w(9)], &w(0)).await,
        Code::InvalidArgument,
        "tasks 0..2",
    );
    assert_code(
        c.barrier("z", 0, t, &[w(1), w(2)], &w(0)).await,
        Code::InvalidArgument,
        "not one of its participants",
    );
    // Malformed requests change nothing.
    assert_code(
        c.barrier("", 0, t, &[], &w(0)).await,
        Code::InvalidArgument,
        "must not be empty",
    );
    assert_code(
        c.barrier("neg", 0, Duration::ZERO, &[], &w(-3)).await,
        Code::InvalidArgument,
        "negative",
    );
    let raw_negative_timeout = tf::BarrierRequest {
        barrier_id: "neg".into(),
        barrier_timeout_in_ms: -5,
        tasks: vec![],
        source_task: Some(w(0)),
        counter: 0,
    };
    let mut raw =
        coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient::connect(
            format!("http://{}", env.cluster.endpoints()[0]),
        )
        .await
        .expect("connect");
    assert_code(
        raw.barrier(raw_negative_timeout).await,
        Code::InvalidArgument,
        "negative",
    );
    // A participant in error: INTERNAL, for those waiting and for new instances.
    let waiting = {
        let c = env.another_client();
        tokio::spawn(async move { c.barrier("e", 0, Duration::from_secs(20), &[], &w(0)).await })
    };
    env.wait_parked(1).await;
    c.report_error(&w(2), Code::Unknown as i32, "crashed")
        .await
        .expect("report");
    assert_code(waiting.await.expect("join"), Code::Internal, "crashed");
    assert_code(
        c.barrier("e2", 0, t, &[], &w(0)).await,
        Code::Internal,
        "is in error",
    );
}

pub async fn shutdown_service_aborts_barriers(replicas: usize) {
    let mut env = Env::start(replicas, &["--job", "worker=2"]).await;
    let c = &env.client.clone();
    register_all(c, 2).await;
    let waiting = {
        let c = env.another_client();
        tokio::spawn(async move { c.barrier("b", 0, Duration::from_secs(30), &[], &w(0)).await })
    };
    env.wait_parked(1).await;
    c.shutdown_service("job finished")
        .await
        .expect("shutdown service");
    assert_code(waiting.await.expect("join"), Code::Aborted, "shutting down");
}

pub async fn shutdown_barrier(replicas: usize) {
    let env = Env::start(
        replicas,
        &["--job", "worker=3", "--shutdown-barrier-timeout-ms", "1500"],
    )
    .await;
    let c = &env.client.clone();
    register_all(c, 3).await;
    // Two tasks shut down together; the third never comes.
    let leaving: Vec<_> = (0..2)
        .map(|i| {
            let c = env.another_client();
            tokio::spawn(async move {
                let started = Instant::now();
                (c.shutdown_task(&w(i)).await, started.elapsed())
            })
        })
        .collect();
    for l in leaving {
        let (r, waited) = l.await.expect("join");
        r.expect("tasks at the barrier disconnect");
        assert!(
            waited >= Duration::from_millis(1300),
            "left before the barrier failed: {waited:?}"
        );
    }
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateDisconnected
    );
    assert_eq!(
        state_of(c, &w(2)).await,
        tf::CoordinatedTaskState::TaskstateError
    );
    let err = tokio::time::timeout(Duration::from_secs(5), c.poll_for_error(&w(2), 0))
        .await
        .expect("the straggler is told")
        .expect("poll");
    assert!(
        err.error_message.contains("shutdown barrier"),
        "{}",
        err.error_message
    );
}

pub async fn shutdown_without_barrier(replicas: usize) {
    let env = Env::start(replicas, &["--job", "worker=2"]).await;
    let c = &env.client.clone();
    register_all(c, 2).await;
    c.shutdown_task(&w(0)).await.expect("shutdown");
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateDisconnected
    );
    assert_code(
        c.heartbeat(&w(0), 100).await,
        Code::FailedPrecondition,
        "not registered",
    );
    c.register_task(&w(0), 200)
        .await
        .expect("may register again");
}

/// Instantiates the suite for an ensemble of `$replicas` replicas.
#[macro_export]
macro_rules! coordination_suite {
    ($replicas:expr) => {
        use $crate::coord_suite as suite;

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn register_and_wait_for_all_tasks() {
            suite::register_and_wait_for_all_tasks($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn registration_rules() {
            suite::registration_rules($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn heartbeats_and_timeouts() {
            suite::heartbeats_and_timeouts($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn reported_errors_reach_every_task() {
            suite::reported_errors_reach_every_task($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn barriers_pass_and_are_reused() {
            suite::barriers_pass_and_are_reused($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn barrier_failures() {
            suite::barrier_failures($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_service_aborts_barriers() {
            suite::shutdown_service_aborts_barriers($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_barrier() {
            suite::shutdown_barrier($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_without_barrier() {
            suite::shutdown_without_barrier($replicas).await
        }
    };
}

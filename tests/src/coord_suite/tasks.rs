//! The suite's checks of tasks: registration and its rules, WaitForAllTasks, heartbeats and their
//! timeouts, and errors reported by one task reaching every other.

use std::time::{Duration, Instant};

use coord_proto::tensorflow as tf;
use tonic::Code;

use super::env::{assert_code, register_all, state_of, task, tf_devices, w, Env};

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
        Code::InvalidArgument,
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
    // ABORTED naming the task's error, as TensorFlow's service answers a task in error; an
    // answer, not "try again": it comes back at once.
    let asked = Instant::now();
    assert_code(
        c.heartbeat(&w(0), 100).await,
        Code::Aborted,
        "already in error: task /job:worker/replica:0/task:0 sent no heartbeat",
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

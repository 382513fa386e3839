//! The suite's checks of shutting down: ShutdownTask with and without a shutdown barrier, and the
//! service's shutdown aborting the barriers still waiting.

use std::time::{Duration, Instant};

use coord_proto::tensorflow as tf;
use tonic::Code;

use super::env::{assert_code, register_all, state_of, w, Env};

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
    // Two tasks shut down together; the third never comes: they are told the barrier failed
    // (INTERNAL, as TensorFlow's service answers), and are disconnected all the same.
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
        assert_code(r, Code::Internal, "Shutdown barrier has failed");
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
    let env = Env::start(
        replicas,
        &["--job", "worker=2", "--heartbeat-timeout-ms", "5000"],
    )
    .await;
    let c = &env.client.clone();
    register_all(c, 2).await;
    c.shutdown_task(&w(0)).await.expect("shutdown");
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateDisconnected
    );
    // A heartbeat already on its way when the task left is accepted for one heartbeat timeout,
    // as TensorFlow's service accepts it, from that incarnation only; it does not reconnect.
    c.heartbeat(&w(0), 100)
        .await
        .expect("a heartbeat within the grace after the disconnect");
    assert_code(
        c.heartbeat(&w(0), 999).await,
        Code::InvalidArgument,
        "not registered",
    );
    assert_eq!(
        state_of(c, &w(0)).await,
        tf::CoordinatedTaskState::TaskstateDisconnected
    );
    // Then refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match c.heartbeat(&w(0), 100).await {
            Err(s) if s.code() == Code::InvalidArgument => break,
            other => assert!(
                Instant::now() < deadline,
                "heartbeats still accepted 30 s after the disconnect: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    c.register_task(&w(0), 200)
        .await
        .expect("may register again");
}

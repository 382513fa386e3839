//! The suite's checks of barriers: instances that pass and are reused, and every way a barrier
//! fails (timeout, cancel, conflicting or unknown participants, malformed requests, a participant
//! in error).

use std::time::{Duration, Instant};

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use tonic::Code;

use super::env::{assert_code, register_all, w, Env};

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

//! A leader change in the middle of a barrier, a WaitForAllTasks, a shutdown barrier or an error
//! poll changes no outcome: committed arrivals stay, callers re-drive their call on the new
//! leader, and timers re-arm from the stored absolute deadlines. Nor does a leader that stalls: the
//! time it was stopped is not counted as its tasks' heartbeat silence.

use std::time::{Duration, Instant};

use coord_proto::tensorflow as tf;
use coord_proto::xla::coordination as xla;
use coord_tests::coord_suite::{assert_code, w, Env, LEADER_TIMEOUT};
use tonic::transport::Channel;
use tonic::Code;

#[path = "coordination_failover/follower.rs"]
mod follower;

async fn leader_of(env: &mut Env) -> u64 {
    env.cluster.wait_for_leader(LEADER_TIMEOUT).await
}

async fn register(env: &Env, n: i32) -> u64 {
    let mut incarnation = 0;
    for i in 0..n {
        incarnation = env
            .client
            .register_task(&w(i), 1000 + i as u64)
            .await
            .expect("register");
    }
    incarnation
}

/// Asserts that every task is in `state`; when one is not, panics saying `why`, with the states.
async fn assert_all_in(env: &Env, state: tf::CoordinatedTaskState, why: &str) {
    let states = env.client.task_states(&[]).await.expect("states");
    assert!(
        states.tasks.iter().all(|t| t.state == state as i32),
        "{why}: {states:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_survives_the_leader_kill() {
    let mut env = Env::start(3, &["--job", "worker=3"]).await;
    let before = register(&env, 3).await;
    let waiting: Vec<_> = (0..2)
        .map(|i| {
            let c = env.another_client();
            tokio::spawn(async move {
                c.barrier("sync", 0, Duration::from_secs(60), &[], &w(i))
                    .await
            })
        })
        .collect();
    env.wait_parked(2).await;
    let old = leader_of(&mut env).await;
    env.cluster.kill(old);
    let new = leader_of(&mut env).await;
    assert_ne!(new, old);
    // The last arrival goes to the new leader; the two committed arrivals are still there.
    assert_eq!(
        env.client
            .barrier("sync", 0, Duration::from_secs(60), &[], &w(2))
            .await
            .expect("last arrival"),
        0
    );
    for wtask in waiting {
        assert_eq!(wtask.await.expect("join").expect("re-driven barrier"), 0);
    }
    // The service incarnation did not change with the leader.
    assert_eq!(
        env.client.heartbeat(&w(0), 1000).await.expect("heartbeat"),
        before
    );
}

type SidecarClient = tf::coordination_service_client::CoordinationServiceClient<Channel>;
type XlaSidecarClient = xla::coordination_service_client::CoordinationServiceClient<Channel>;

/// Three tasks through coord-proxy: tasks 0 and 1 call (`call(channel, task, service
/// incarnation)`), the sidecar's one call for them is parked on the leader, the leader is killed;
/// then task 2 calls. Returns task 2's answer, from the new leader, and the first two's.
async fn across_a_kill_through_a_sidecar<T, F, Fut>(call: F) -> (T, Vec<T>)
where
    T: Send + 'static,
    F: Fn(Channel, i32, u64) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
{
    let mut env = Env::start(3, &["--job", "worker=3"]).await;
    let sidecar = coord_tests::jax::Sidecar::start(&env.cluster.endpoints());
    let service = register(&env, 3).await;
    let ch = Channel::from_shared(format!("http://{}", sidecar.addr))
        .expect("uri")
        .connect()
        .await
        .expect("connect to the sidecar");
    let answer = |i: i32| {
        let call = call(ch.clone(), i, service);
        async move {
            let answered = tokio::spawn(call).await.expect("join");
            answered
                .unwrap_or_else(|s| panic!("task {i} through the sidecar: {s:?}"))
                .into_inner()
        }
    };
    let waiting: Vec<_> = (0..2).map(|i| tokio::spawn(answer(i))).collect();
    // The sidecar's one call, parked once an arrival is recorded (the other may still be on its
    // way: the proxy sends it again to the new leader).
    env.wait_parked(1).await;
    let old = leader_of(&mut env).await;
    env.cluster.kill(old);
    let new = leader_of(&mut env).await;
    assert_ne!(new, old);
    let last = answer(2).await;
    let mut earlier = Vec::new();
    for wtask in waiting {
        earlier.push(wtask.await.expect("join"));
    }
    (last, earlier)
}

/// coord-proxy records its tasks' arrivals and waits on the barrier with one call: that wait is
/// re-parked on the new leader, and every task is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecars_barrier_wait_survives_the_leader_kill() {
    let (last, earlier) = across_a_kill_through_a_sidecar(|ch, i, _| async move {
        SidecarClient::new(ch)
            .barrier(tf::BarrierRequest {
                barrier_id: "sync".into(),
                barrier_timeout_in_ms: 60_000,
                tasks: Vec::new(),
                source_task: Some(w(i)),
                counter: 0,
            })
            .await
    })
    .await;
    assert_eq!(last.counter, 0);
    for answer in earlier {
        assert_eq!(answer.counter, 0, "the re-parked wait's answer");
    }
}

/// coord-proxy records its tasks' WaitForAllTasks arrivals and fetches the job's devices with one
/// of their calls: that call is re-driven on the new leader, and every task gets the devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecars_wait_for_all_tasks_survives_the_leader_kill() {
    let (last, earlier) = across_a_kill_through_a_sidecar(|ch, i, _| async move {
        SidecarClient::new(ch)
            .wait_for_all_tasks(tf::WaitForAllTasksRequest {
                source_task: Some(w(i)),
                local_device_info: None,
                device_info: Some(tf::DeviceInfo::default()),
            })
            .await
    })
    .await;
    for answer in earlier {
        assert_eq!(answer, last, "every task gets the same answer");
    }
}

/// coord-proxy records its tasks' GetAliveTasks asks together (each under its own request
/// number) and waits on the round with one call: the asks stay in their round, the wait is
/// re-parked on the new leader, and every task gets the round's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecars_get_alive_tasks_survives_the_leader_kill() {
    let (last, earlier) = across_a_kill_through_a_sidecar(|ch, i, service| async move {
        let incarnations = xla::Incarnations {
            task_id: i,
            task_incarnation: 0,
            service_incarnation: service,
        };
        XlaSidecarClient::new(ch)
            .get_alive_tasks(xla::GetAliveTasksRequest {
                incarnations: Some(incarnations),
                requesting_task_id: i,
                task_ids: vec![2, 1, 0],
            })
            .await
    })
    .await;
    assert_eq!(last.alive_task_ids, vec![0, 1, 2]);
    assert_eq!(last.incarnations, vec![1000, 1001, 1002]);
    for answer in earlier {
        assert_eq!(answer, last, "the round's answer, for every task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_barrier_deadline_fires_on_the_new_leader() {
    let mut env = Env::start(3, &["--job", "worker=2"]).await;
    register(&env, 2).await;
    let started = Instant::now();
    let waiting = {
        let c = env.another_client();
        tokio::spawn(async move {
            c.barrier("timed", 0, Duration::from_millis(4000), &[], &w(0))
                .await
        })
    };
    env.wait_parked(1).await;
    let old = leader_of(&mut env).await;
    env.cluster.kill(old);
    leader_of(&mut env).await;
    // Nobody else arrives: the deadline set at the first arrival (on the dead leader) fails it.
    assert_code(
        waiting.await.expect("join"),
        Code::DeadlineExceeded,
        "timed out after 4000 ms",
    );
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(3900),
        "failed before its deadline: {took:?}"
    );
    assert!(
        took < Duration::from_millis(12_000),
        "deadline not re-armed promptly: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_all_tasks_survives_the_leader_kill() {
    let mut env = Env::start(3, &["--job", "worker=3"]).await;
    register(&env, 3).await;
    let devices = |i: i32| tf::CoordinationServiceDeviceInfo {
        r#type: Some(tf::coordination_service_device_info::Type::Tf(
            tf::TfDeviceList {
                devices: vec![bytes::Bytes::from(format!("gpu-of-{i}"))],
            },
        )),
    };
    let waiting: Vec<_> = (0..2)
        .map(|i| {
            let c = env.another_client();
            let d = devices(i);
            tokio::spawn(async move { c.wait_for_all_tasks(&w(i), Some(d)).await })
        })
        .collect();
    env.wait_parked(2).await;
    let old = leader_of(&mut env).await;
    env.cluster.kill(old);
    leader_of(&mut env).await;
    let last = env
        .client
        .wait_for_all_tasks(&w(2), Some(devices(2)))
        .await
        .expect("last");
    for wtask in waiting {
        let resp = wtask.await.expect("join").expect("re-driven wait");
        assert_eq!(
            resp.cluster_device_info, last.cluster_device_info,
            "everyone sees the same devices"
        );
    }
    match last.cluster_device_info.and_then(|d| d.r#type) {
        Some(tf::coordination_service_device_info::Type::Tf(l)) => assert_eq!(l.devices.len(), 3),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_barrier_survives_the_leader_kill() {
    let mut env = Env::start(
        3,
        &[
            "--job",
            "worker=3",
            "--shutdown-barrier-timeout-ms",
            "60000",
        ],
    )
    .await;
    register(&env, 3).await;
    let leaving: Vec<_> = (0..2)
        .map(|i| {
            let c = env.another_client();
            tokio::spawn(async move { c.shutdown_task(&w(i)).await })
        })
        .collect();
    env.wait_parked(2).await;
    let old = leader_of(&mut env).await;
    env.cluster.kill(old);
    leader_of(&mut env).await;
    env.client
        .shutdown_task(&w(2))
        .await
        .expect("last task shuts down");
    for l in leaving {
        l.await.expect("join").expect("re-driven shutdown");
    }
    assert_all_in(
        &env,
        tf::CoordinatedTaskState::TaskstateDisconnected,
        "all disconnect together",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_reach_agents_across_a_leader_change() {
    let mut env = Env::start(3, &["--job", "worker=3"]).await;
    register(&env, 3).await;
    let polls: Vec<_> = (1..3)
        .map(|i| {
            let c = env.another_client();
            tokio::spawn(async move { c.poll_for_error(&w(i), 0).await })
        })
        .collect();
    env.wait_parked(2).await;
    let old = leader_of(&mut env).await;
    env.cluster.kill(old);
    leader_of(&mut env).await;
    let reported = Instant::now();
    env.client
        .report_error(&w(0), Code::Internal as i32, "NaN loss")
        .await
        .expect("report");
    for p in polls {
        let e = p
            .await
            .expect("join")
            .expect("poll re-driven on the new leader");
        assert!(e.error_message.contains("NaN loss"));
        assert_eq!(e.error_payload.and_then(|p| p.source_task), Some(w(0)));
    }
    assert!(
        reported.elapsed() < Duration::from_secs(1),
        "learned after {:?}",
        reported.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_gives_tasks_a_full_heartbeat_timeout() {
    let mut env = Env::start(3, &["--job", "worker=2", "--heartbeat-timeout-ms", "3000"]).await;
    register(&env, 2).await;
    let beat = |i: i32| {
        let c = env.another_client();
        tokio::spawn(async move {
            loop {
                let _ = c.heartbeat(&w(i), 1000 + i as u64).await;
                // The heartbeat interval.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let beats = [beat(0), beat(1)];
    let old = leader_of(&mut env).await;
    env.cluster.kill(old);
    leader_of(&mut env).await;
    // Tasks that keep heartbeating through the failover stay connected well past the timeout.
    let until = Instant::now() + Duration::from_millis(4500);
    while Instant::now() < until {
        assert_all_in(
            &env,
            tf::CoordinatedTaskState::TaskstateConnected,
            "a heartbeating task was put in error after the leader change",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for b in beats {
        b.abort();
    }
}

/// A leader stopped (SIGSTOP: a stalled VM, an overloaded host) for longer than the heartbeat
/// timeout declares no task dead when it resumes: it read nothing meanwhile, so the time is its
/// own stall, not its tasks' silence. One replica, so no other leader takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_leader_declares_no_task_dead() {
    let mut env = Env::start(1, &["--job", "worker=2", "--heartbeat-timeout-ms", "1500"]).await;
    let incarnation = register(&env, 2).await;
    let leader = leader_of(&mut env).await;
    let before = env
        .cluster
        .metric(leader, "coord_replica_stalled_seconds_total");
    for i in 0..2 {
        env.client
            .heartbeat(&w(i), 1000 + i as u64)
            .await
            .expect("heartbeat");
    }
    env.cluster.pause(leader);
    // The stall itself: a duration, not a wait for a condition.
    tokio::time::sleep(Duration::from_secs(4)).await;
    env.cluster.resume(leader);
    for i in 0..2 {
        assert_eq!(
            env.client
                .heartbeat(&w(i), 1000 + i as u64)
                .await
                .expect("heartbeat after the stall"),
            incarnation,
            "w{i}'s first heartbeat after the stall"
        );
    }
    assert_all_in(
        &env,
        tf::CoordinatedTaskState::TaskstateConnected,
        "a task was put in error for the leader's own stall",
    )
    .await;
    let stalled = env
        .cluster
        .metric(leader, "coord_replica_stalled_seconds_total")
        - before;
    assert!(
        (3.0..6.0).contains(&stalled),
        "4 s stopped, counted as {stalled:.2} s of stall"
    );
}

/// A call without a request id (every TensorFlow and jaxlib call) is numbered by the replica it
/// came in by and keeps its number while it parks. Past 16,384 later writes of that replica's, the
/// ensemble would forget the parked call's result (it keeps that many per client): re-driven on
/// the new leader after a kill, the call was refused as a duplicate of one already answered, and a
/// job of 30,000 jaxlib tasks, each GetAliveTasks call parked, had calls refused so without any
/// kill. The replica's numbers go in lanes instead, none a window ahead of its oldest call in
/// flight, and the parked arrival is found again: the barrier passes with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_call_outlasts_a_window_of_later_writes_and_the_leader_kill() {
    const LATER_WRITES: usize = 16_500;
    // The tasks do not heartbeat: what is tested is the parked call alone.
    let flags = ["--job", "worker=2", "--heartbeat-timeout-ms", "3600000"];
    let mut env = Env::start(3, &flags).await;
    register(&env, 2).await;
    let leader = leader_of(&mut env).await;
    let follower = env.cluster.other_than(leader);
    let at = format!("http://{}", env.cluster.replica(follower).grpc);
    let ch = Channel::from_shared(at)
        .expect("uri")
        .connect()
        .await
        .expect("connect to the follower");
    let parked = {
        let mut c = SidecarClient::new(ch.clone());
        tokio::spawn(async move {
            c.barrier(tf::BarrierRequest {
                barrier_id: "window".into(),
                barrier_timeout_in_ms: 300_000,
                tasks: vec![],
                source_task: Some(w(0)),
                counter: 0,
            })
            .await
        })
    };
    env.wait_parked(1).await;
    // The later writes, through the same replica, also without ids.
    let writers: Vec<_> = (0..64)
        .map(|k| {
            let mut c = SidecarClient::new(ch.clone());
            tokio::spawn(async move {
                for i in (k..LATER_WRITES).step_by(64) {
                    c.insert_key_value(tf::InsertKeyValueRequest {
                        kv: Some(tf::KeyValueEntry {
                            key: format!("window/{i}"),
                            value: "v".into(),
                        }),
                        allow_overwrite: false,
                    })
                    .await
                    .unwrap_or_else(|s| panic!("write {i}: {s:?}"));
                }
            })
        })
        .collect();
    let started = std::time::Instant::now();
    for t in writers {
        t.await.expect("join");
    }
    eprintln!("{LATER_WRITES} writes in {:?}", started.elapsed());
    env.cluster.kill(leader);
    assert_ne!(leader_of(&mut env).await, leader);
    // The follower re-drives the parked arrival on the new leader (or on itself), before or after
    // the other task's arrival passes the barrier for both.
    assert_eq!(
        env.client
            .barrier("window", 0, Duration::from_secs(60), &[], &w(1))
            .await
            .expect("the last arrival"),
        0
    );
    let answer = parked.await.expect("join");
    assert_eq!(
        answer
            .expect("the parked arrival, re-driven")
            .into_inner()
            .counter,
        0
    );
    let last = env
        .client
        .try_get(&format!("window/{}", LATER_WRITES - 1))
        .await
        .expect("the last write");
    assert_eq!(last.as_deref(), Some(&b"v"[..]));
}

//! Calls through a follower that waits on their round on the leader once for all its callers
//! (jaxlib's GetAliveTasks, TensorFlow's WaitForAllTasks) or read a value once for them, with the
//! leader killed under the wait.

use coord_proto::tensorflow as tf;
use coord_proto::xla::coordination as xla;
use coord_tests::coord_suite::{w, Env, LEADER_TIMEOUT};
use tonic::transport::Channel;

use super::{leader_of, register, SidecarClient, XlaSidecarClient};

/// A 3-replica ensemble of job `worker` (3 tasks, registered): its service incarnation, its
/// leader, a follower and a channel to it.
async fn through_a_follower() -> (Env, u64, u64, u64, Channel) {
    let mut env = Env::start(3, &["--job", "worker=3"]).await;
    let service = register(&env, 3).await;
    let leader = leader_of(&mut env).await;
    let follower = (1..=3).find(|&id| id != leader).expect("a follower");
    let ch = Channel::from_shared(format!("http://{}", env.cluster.replica(follower).grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect to the follower");
    (env, service, leader, follower, ch)
}

/// Once `follower` holds two calls (their arrivals recorded on the leader) under one wait on the
/// leader, kills the leader `old` and waits for the next.
async fn killed_under_one_wait(env: &mut Env, old: u64, follower: u64) {
    env.cluster
        .wait_until(LEADER_TIMEOUT, "the follower holds both calls", |c| {
            c.metric(follower, "coord_relayed_waiting_calls") == 2.0
        })
        .await;
    assert_eq!(
        env.cluster.metric(follower, "coord_relayed_waits_total"),
        1.0,
        "one wait on the leader for both callers"
    );
    env.cluster.kill(old);
    assert_ne!(leader_of(env).await, old);
}

/// jaxlib's own GetAliveTasks calls through a follower: the follower records each call's ask on
/// the leader and waits on the round there once for both callers; the leader is killed under that
/// wait. The asks stay in their round (each recorded once, under its call's request id), the
/// wait is sent again to the new leader (or parked on the follower, if it now leads), and every
/// task gets the round's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_alive_tasks_through_a_follower_survives_the_leader_kill() {
    let (mut env, service, old, follower, ch) = through_a_follower().await;
    let ask = |i: i32| {
        let mut c = XlaSidecarClient::new(ch.clone());
        let req = xla::GetAliveTasksRequest {
            incarnations: Some(xla::Incarnations {
                task_id: i,
                task_incarnation: 0,
                service_incarnation: service,
            }),
            requesting_task_id: i,
            task_ids: vec![2, 1, 0],
        };
        async move {
            c.get_alive_tasks(req)
                .await
                .unwrap_or_else(|s| panic!("task {i} through the follower: {s:?}"))
                .into_inner()
        }
    };
    let waiting: Vec<_> = (0..2).map(|i| tokio::spawn(ask(i))).collect();
    killed_under_one_wait(&mut env, old, follower).await;
    let last = ask(2).await;
    assert_eq!(last.alive_task_ids, vec![0, 1, 2]);
    assert_eq!(last.incarnations, vec![1000, 1001, 1002]);
    for waited in waiting {
        assert_eq!(waited.await.expect("join"), last, "the round's answer");
    }
}

/// TensorFlow's own WaitForAllTasks calls through a follower: the follower records each
/// caller's arrival on the leader and fetches the job's devices there once for both; the leader
/// is killed under that fetch. The arrivals stay, the fetch is sent again to the new leader (or
/// served by the follower, if it now leads), and every task gets the same devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_all_tasks_through_a_follower_survives_the_leader_kill() {
    let (mut env, _, old, follower, ch) = through_a_follower().await;
    let wait = |i: i32| {
        let mut c = SidecarClient::new(ch.clone());
        let req = tf::WaitForAllTasksRequest {
            source_task: Some(w(i)),
            local_device_info: None,
            device_info: Some(tf::DeviceInfo {
                device: vec![tf::AnyMessage {
                    type_url: "type.googleapis.com/tensorflow.DeviceAttributes".into(),
                    value: format!("dev-{i}").into(),
                }],
            }),
        };
        async move {
            c.wait_for_all_tasks(req)
                .await
                .unwrap_or_else(|s| panic!("task {i} through the follower: {s:?}"))
                .into_inner()
        }
    };
    let waiting: Vec<_> = (0..2).map(|i| tokio::spawn(wait(i))).collect();
    killed_under_one_wait(&mut env, old, follower).await;
    let last = wait(2).await;
    let devices: Vec<_> = (last.device_info.clone().expect("devices").device)
        .into_iter()
        .map(|d| d.value)
        .collect();
    assert_eq!(devices, ["dev-0", "dev-1", "dev-2"].map(bytes::Bytes::from));
    for waited in waiting {
        assert_eq!(waited.await.expect("join"), last, "the job's devices");
    }
}

/// A job's processes reading one value through a follower (JAX's topology, after a failover left
/// them calling a replica that no longer leads): the callers of one read that come while it is on
/// its way are answered by the next, so the follower sends the leader far fewer reads than it
/// has callers, and each caller still reads what it could have read on its own: a value written
/// again is read anew, and reads parked on a leader that is killed are answered by the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_key_value_through_a_follower_reads_once_for_many_callers() {
    const CALLERS: usize = 100;
    let (mut env, _, old, follower, ch) = through_a_follower().await;
    let value = |tag: &str| bytes::Bytes::from(format!("{tag}:").repeat(16 << 10));
    let read = |key: &'static str| {
        let mut c = SidecarClient::new(ch.clone());
        tokio::spawn(async move {
            c.get_key_value(tf::GetKeyValueRequest { key: key.into() })
                .await
                .unwrap_or_else(|s| panic!("GetKeyValue {key} through the follower: {s:?}"))
                .into_inner()
                .kv
                .map(|kv| kv.value)
        })
    };
    let insert = |key: &str, value: bytes::Bytes| {
        let mut c = SidecarClient::new(ch.clone());
        let req = tf::InsertKeyValueRequest {
            kv: Some(tf::KeyValueEntry {
                key: key.into(),
                value,
            }),
            allow_overwrite: true,
        };
        async move { c.insert_key_value(req).await.expect("InsertKeyValue") }
    };
    let reads = |env: &Env| {
        [
            "coord_relayed_reads_total",
            "coord_relayed_read_calls_total",
        ]
        .map(|m| env.cluster.metric(follower, m))
    };

    // Every caller waits for the key; the first read parks on the leader, the others wait for it.
    let waiting: Vec<_> = (0..CALLERS).map(|_| read("topology")).collect();
    env.cluster
        .wait_until(LEADER_TIMEOUT, "the first read parked on the leader", |c| {
            c.metric(follower, "coord_relayed_read_calls_total") == 1.0
        })
        .await;
    insert("topology", value("v1")).await;
    for r in waiting {
        assert_eq!(r.await.expect("join"), Some(value("v1")));
    }
    let [callers, sent] = reads(&env);
    assert_eq!(callers, CALLERS as f64, "every caller's read relayed");
    assert!(
        sent * 4.0 <= callers,
        "the follower sent {sent} reads for {callers} callers"
    );

    // Written again: a read that comes after the write reads the new value.
    insert("topology", value("v2")).await;
    assert_eq!(read("topology").await.expect("join"), Some(value("v2")));

    // Reads parked on a leader that is killed: driven again on the next, and answered there.
    let before = reads(&env)[1];
    let waiting: Vec<_> = (0..CALLERS).map(|_| read("after-kill")).collect();
    env.cluster
        .wait_until(LEADER_TIMEOUT, "a read parked on the leader", |c| {
            c.metric(follower, "coord_relayed_read_calls_total") > before
        })
        .await;
    env.cluster.kill(old);
    assert_ne!(leader_of(&mut env).await, old);
    insert("after-kill", value("v3")).await;
    for r in waiting {
        assert_eq!(r.await.expect("join"), Some(value("v3")));
    }
}

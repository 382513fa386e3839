//! The agent's API against a 3-replica ensemble: state machine, error callback, key-value,
//! barriers, watches.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use coord_agent::{Agent, AgentConfig, AgentState, ChangeKind, KeyChange};
use coord_proto::tensorflow as tf;
use coord_tests::coord_suite::Env;
use tonic::{Code, Status};

/// An agent for task `id` of job `worker` that records the errors its callback receives.
fn agent(env: &Env, id: i32) -> (Agent, Arc<Mutex<Vec<Status>>>) {
    let mut config = AgentConfig::new(env.cluster.endpoints(), "worker", id);
    config.heartbeat_interval = Duration::from_millis(300);
    config.heartbeat_timeout = Duration::from_secs(3);
    config.unavailable_after = Duration::from_secs(10);
    let errors = Arc::new(Mutex::new(Vec::new()));
    let seen = errors.clone();
    let a = Agent::new(config, move |e| seen.lock().expect("lock").push(e.clone())).expect("agent");
    (a, errors)
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_and_device_exchange() {
    let env = Env::start(3, &["--job", "worker=2"]).await;
    let (a, _) = agent(&env, 0);
    let (b, _) = agent(&env, 1);
    assert_eq!(a.state(), AgentState::Disconnected);
    let e = a
        .wait_for_all_tasks(None)
        .await
        .expect_err("not connected yet");
    assert_eq!(e.code(), Code::FailedPrecondition);
    a.connect().await.expect("connect");
    b.connect().await.expect("connect");
    assert_eq!(a.state(), AgentState::Running);
    assert_ne!(a.service_incarnation(), 0);
    assert_eq!(a.service_incarnation(), b.service_incarnation());
    let devices = |name: &str| tf::CoordinationServiceDeviceInfo {
        r#type: Some(tf::coordination_service_device_info::Type::Tf(
            tf::TfDeviceList {
                devices: vec![Bytes::from(name.to_string())],
            },
        )),
    };
    let (ra, rb) = tokio::join!(
        a.wait_for_all_tasks(Some(devices("a"))),
        b.wait_for_all_tasks(Some(devices("b")))
    );
    ra.expect("wait");
    rb.expect("wait");
    assert_eq!(a.cluster_device_attributes(), b.cluster_device_attributes());
    let status = a.task_status("worker", 1).await.expect("status");
    assert_eq!(status.state, tf::CoordinatedTaskState::TaskstateConnected);
    a.shutdown().await.expect("shutdown");
    assert_eq!(a.state(), AgentState::Disconnected);
    let status = b.task_status("worker", 0).await.expect("status");
    assert_eq!(
        status.state,
        tf::CoordinatedTaskState::TaskstateDisconnected
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_reach_the_callback_and_reset_recovers() {
    let env = Env::start(3, &["--job", "worker=2"]).await;
    let (a, a_errors) = agent(&env, 0);
    let (b, b_errors) = agent(&env, 1);
    a.connect().await.expect("connect");
    b.connect().await.expect("connect");
    a.report_error(&Status::internal("loss is NaN"))
        .await
        .expect("report");
    assert_eq!(a.state(), AgentState::Error);
    assert_eq!(
        a_errors.lock().expect("lock").len(),
        1,
        "the callback ran once"
    );
    eventually("b to learn of a's error", || b.state() == AgentState::Error).await;
    let got = b_errors.lock().expect("lock").clone();
    assert_eq!(got.len(), 1);
    assert!(got[0].message().contains("loss is NaN"), "{:?}", got[0]);
    // a resets and connects again.
    a.reset().await.expect("reset");
    assert_eq!(a.state(), AgentState::Disconnected);
    a.connect().await.expect("connect again");
    assert_eq!(a.state(), AgentState::Running);
    let e = b.reset().await;
    assert!(e.is_ok(), "b can reset too: {e:?}");
}

/// As TensorFlow's agent: a task has one error until it resets; a second report is refused and
/// changes nothing, here or at the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_error_report_is_refused_and_the_first_error_stays() {
    let env = Env::start(3, &["--job", "worker=1"]).await;
    let (a, errors) = agent(&env, 0);
    a.connect().await.expect("connect");
    a.report_error(&Status::internal("loss is NaN"))
        .await
        .expect("first report");
    assert_eq!(a.state(), AgentState::Error);
    let e = a
        .report_error(&Status::unavailable("the GPU fell off the bus"))
        .await
        .expect_err("already in error");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("worker/0"), "names the task: {e:?}");
    assert!(e.message().contains("already in error"), "{e:?}");
    let kept = a.error().expect("the agent's error");
    assert_eq!(kept.code(), Code::Internal);
    assert_eq!(kept.message(), "loss is NaN");
    assert_eq!(
        errors.lock().expect("lock").len(),
        1,
        "the callback ran once"
    );
    let status = a.task_status("worker", 0).await.expect("status");
    let at_service = status.error.expect("the service has the task's error");
    assert!(
        at_service.message().contains("loss is NaN"),
        "the service kept the first error: {at_service:?}"
    );
    // After a reset the task may fail again.
    a.reset().await.expect("reset");
    a.report_error(&Status::internal("diverged"))
        .await
        .expect("a report after the reset");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_task_puts_the_old_incarnation_in_error() {
    let env = Env::start(3, &["--job", "worker=1"]).await;
    let (old, old_errors) = agent(&env, 0);
    old.connect().await.expect("connect");
    // The task "restarts": a new incarnation registers while the old one is connected.
    let (new, _) = agent(&env, 0);
    let e = new.connect().await.expect_err("the restart is refused");
    assert_eq!(e.code(), Code::Aborted);
    // The old incarnation's heartbeats now get the task's error: its callback fires.
    eventually("the old incarnation's error callback", || {
        !old_errors.lock().expect("lock").is_empty()
    })
    .await;
    assert_eq!(old.state(), AgentState::Error);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_that_stop_being_acknowledged_raise_the_error() {
    let mut env = Env::start(3, &["--job", "worker=1"]).await;
    let (a, errors) = agent(&env, 0);
    a.connect().await.expect("connect");
    for id in env.cluster.ids() {
        env.cluster.kill(id);
    }
    eventually("the heartbeat loop to give up", || {
        a.state() == AgentState::Error
    })
    .await;
    let e = errors.lock().expect("lock")[0].clone();
    assert_eq!(e.code(), Code::Unavailable);
    assert!(e.message().contains("no heartbeat"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_values() {
    let env = Env::start(3, &["--job", "worker=1"]).await;
    let (a, _) = agent(&env, 0);
    a.insert_key_value("cfg/lr", "0.1").await.expect("insert");
    let e = a
        .insert_key_value("cfg/lr", "0.2")
        .await
        .expect_err("exists");
    assert_eq!(e.code(), Code::AlreadyExists);
    a.update_key_value("cfg/lr", "0.2").await.expect("update");
    assert_eq!(
        a.get_key_value("cfg/lr", None).await.expect("get"),
        Bytes::from("0.2")
    );
    let e = a
        .get_key_value("cfg/missing", Some(Duration::from_millis(300)))
        .await
        .expect_err("timeout");
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert_eq!(
        a.try_get_key_value("cfg/missing").await.expect("try get"),
        None
    );
    assert_eq!(a.increment_key_value("count", 5).await.expect("incr"), 5);
    assert_eq!(a.increment_key_value("count", -2).await.expect("incr"), 3);
    a.insert_key_value("cfg/bs", "32").await.expect("insert");
    let dir = a.get_key_value_dir("cfg").await.expect("dir");
    assert_eq!(
        dir.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        ["cfg/bs", "cfg/lr"]
    );
    a.delete_key_value("cfg").await.expect("delete");
    assert!(a.get_key_value_dir("cfg").await.expect("dir").is_empty());
}

/// As TensorFlow's agent: an async get calls back exactly once, with CANCELLED if it was cancelled
/// first, with the value if that came first (a later cancel changes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_gets_call_back_exactly_once() {
    let env = Env::start(3, &["--job", "worker=1"]).await;
    let (a, _) = agent(&env, 0);
    type Calls = Arc<Mutex<Vec<Result<Bytes, Status>>>>;
    let recorder = |calls: &Calls| {
        let calls = calls.clone();
        move |r: Result<Bytes, Status>| calls.lock().expect("lock").push(r)
    };

    let cancelled: Calls = Arc::default();
    let h = a.get_key_value_async("never", recorder(&cancelled));
    h.cancel();
    eventually("the cancelled get's callback", || {
        !cancelled.lock().expect("lock").is_empty()
    })
    .await;
    eventually("the cancelled get to finish", || h.is_finished()).await;
    h.cancel();
    {
        let got = cancelled.lock().expect("lock");
        assert_eq!(got.len(), 1, "called back once: {got:?}");
        let e = got[0].as_ref().expect_err("cancelled");
        assert_eq!(e.code(), Code::Cancelled, "{e:?}");
        assert!(e.message().contains("never"), "names the key: {e:?}");
    }

    let answered: Calls = Arc::default();
    let h = a.get_key_value_async("soon", recorder(&answered));
    a.insert_key_value("soon", "here").await.expect("insert");
    eventually("the answered get to finish", || h.is_finished()).await;
    h.cancel();
    {
        let got = answered.lock().expect("lock");
        assert_eq!(got.len(), 1, "called back once: {got:?}");
        assert_eq!(got[0].as_ref().expect("value"), &Bytes::from("here"));
    }

    // Dropping the handle does not cancel the get.
    let dropped: Calls = Arc::default();
    drop(a.get_key_value_async("later", recorder(&dropped)));
    a.insert_key_value("later", "still").await.expect("insert");
    eventually("the get whose handle was dropped", || {
        !dropped.lock().expect("lock").is_empty()
    })
    .await;
    let got = dropped.lock().expect("lock");
    assert_eq!(got[0].as_ref().expect("value"), &Bytes::from("still"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn barriers_can_be_used_again() {
    let mut env = Env::start(3, &["--job", "worker=2"]).await;
    let (a, _) = agent(&env, 0);
    let (b, _) = agent(&env, 1);
    a.connect().await.expect("connect");
    b.connect().await.expect("connect");
    for step in 0..3 {
        let (ra, rb) = tokio::join!(
            a.wait_at_barrier("step", Duration::from_secs(20), &[]),
            b.wait_at_barrier("step", Duration::from_secs(20), &[])
        );
        ra.unwrap_or_else(|e| panic!("step {step}: {e:?}"));
        rb.unwrap_or_else(|e| panic!("step {step}: {e:?}"));
    }
    // A cancelled use fails for both, and the next use works again.
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move {
            b.wait_at_barrier("step", Duration::from_secs(20), &[])
                .await
        })
    };
    env.wait_parked(1).await;
    a.cancel_barrier("step").await.expect("cancel");
    assert_eq!(
        waiting.await.expect("join").expect_err("cancelled").code(),
        Code::Cancelled
    );
    assert_eq!(
        a.wait_at_barrier("step", Duration::from_secs(5), &[])
            .await
            .expect_err("same instance")
            .code(),
        Code::Cancelled
    );
    let (ra, rb) = tokio::join!(
        a.wait_at_barrier("step", Duration::from_secs(20), &[]),
        b.wait_at_barrier("step", Duration::from_secs(20), &[])
    );
    ra.expect("next use");
    rb.expect("next use");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_deliver_changes_in_order() {
    let mut env = Env::start(3, &["--job", "worker=1"]).await;
    let (a, _) = agent(&env, 0);
    let seen: Arc<Mutex<Vec<KeyChange>>> = Arc::default();
    let s = seen.clone();
    a.start_watch_key("cfg", move |r| {
        s.lock().expect("lock").extend(r.expect("watch"))
    })
    .expect("watch");
    assert_eq!(
        a.start_watch_key("cfg", |_| {}).expect_err("twice").code(),
        Code::AlreadyExists
    );
    // The watch runs from "now": let it start before the first change.
    env.wait_watches(1).await;
    a.insert_key_value("cfg/a", "1").await.expect("put");
    a.update_key_value("cfg/a", "2").await.expect("put");
    a.insert_key_value("other", "x").await.expect("put");
    a.insert_key_value("cfg/b/c", "3").await.expect("put");
    a.delete_key_value("cfg").await.expect("delete");
    eventually("five changes", || seen.lock().expect("lock").len() >= 5).await;
    let got: Vec<(ChangeKind, String, String)> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|c| {
            (
                c.kind,
                c.key.clone(),
                String::from_utf8_lossy(&c.value).to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (ChangeKind::Put, "cfg/a".into(), "1".into()),
            (ChangeKind::Put, "cfg/a".into(), "2".into()),
            (ChangeKind::Put, "cfg/b/c".into(), "3".into()),
            (ChangeKind::Delete, "cfg/a".into(), String::new()),
            (ChangeKind::Delete, "cfg/b/c".into(), String::new()),
        ]
    );
    let revisions: Vec<u64> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|c| c.revision)
        .collect();
    assert!(revisions.windows(2).all(|w| w[0] < w[1]), "{revisions:?}");
    a.stop_watch_key("cfg").expect("stop");
    a.insert_key_value("cfg/after", "x").await.expect("put");
    assert_eq!(
        a.stop_watch_key("cfg").expect_err("stopped").code(),
        Code::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_agent_works_from_plain_threads() {
    let env = Env::start(3, &["--job", "worker=2"]).await;
    let endpoints = env.cluster.endpoints();
    let run = move |id: i32| {
        let endpoints = endpoints.clone();
        std::thread::spawn(move || {
            let mut config = AgentConfig::new(endpoints, "worker", id);
            config.heartbeat_interval = Duration::from_millis(300);
            let a = coord_agent::BlockingAgent::new(config, |_| {}).expect("agent");
            a.connect().expect("connect");
            a.insert_key_value(&format!("addr/{id}"), format!("host-{id}"))
                .expect("insert");
            let peer = a
                .get_key_value(&format!("addr/{}", 1 - id), Some(Duration::from_secs(20)))
                .expect("peer");
            a.wait_at_barrier("ready", Duration::from_secs(20), &[])
                .expect("barrier");
            a.shutdown().expect("shutdown");
            String::from_utf8_lossy(&peer).to_string()
        })
    };
    let (t0, t1) = (run(0), run(1));
    let (p0, p1) = tokio::task::spawn_blocking(move || {
        (t0.join().expect("thread 0"), t1.join().expect("thread 1"))
    })
    .await
    .expect("join");
    assert_eq!((p0.as_str(), p1.as_str()), ("host-1", "host-0"));
}

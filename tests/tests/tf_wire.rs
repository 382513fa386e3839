//! TensorFlow 2.21's `tensorflow.CoordinationService` on the wire: the conformance script
//! (`coord_tests::tf_conformance`) against TensorFlow's own service and against the ensemble,
//! through a replica and through coord-proxy, compared call by call. Task 0 is a real
//! `tensorflow-cpu` 2.21 process in each run (in a venv the tests make; the tests skip, saying
//! why, where it cannot be had).

use std::time::Duration;

use coord_tests::cluster::free_ports;
use coord_tests::jax::Sidecar;
use coord_tests::tf::Tf;
use coord_tests::tf_conformance;
use coord_tests::{Cluster, ClusterOptions};
use serde_json::{json, Value};

const HEARTBEAT_TIMEOUT_MS: &str = "30000";

/// Where the service is: TensorFlow's own (hosted by task 0), or the ensemble at an address.
enum Service<'a> {
    TensorFlows,
    At(&'a str),
}

/// Task 0 started (hosting the service or pointed at it), the script run against the service;
/// the script's outcomes.
async fn script_against(tf: &Tf, service: Service<'_>) -> Vec<Value> {
    let own = format!("127.0.0.1:{}", free_ports(1)[0]);
    let (leader, target) = match service {
        Service::TensorFlows => ("self".to_string(), own.clone()),
        Service::At(addr) => (addr.to_string(), addr.to_string()),
    };
    let args: Vec<String> = [
        "--address",
        &own,
        "--leader",
        &leader,
        "--heartbeat-timeout-ms",
        HEARTBEAT_TIMEOUT_MS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let host = tf.script("coordination_host.py", &args, 0);
    let log = tf_conformance::run(&target).await;
    // TensorFlow's own agent saw every task come, as the script's WaitForAllTasks did.
    host.wait_event("ready", Duration::from_secs(60)).await;
    log
}

fn ensemble() -> Cluster {
    Cluster::start(ClusterOptions {
        extra_args: vec![
            "--job".into(),
            "worker=3".into(),
            "--heartbeat-timeout-ms".into(),
            HEARTBEAT_TIMEOUT_MS.into(),
        ],
        ..ClusterOptions::default()
    })
}

fn show(log: &[Value]) -> String {
    log.iter().map(|l| format!("{l}\n")).collect()
}

/// The calls the ensemble answers otherwise than TensorFlow 2.21's own service, on purpose
/// (README, "TensorFlow"): step, task, TensorFlow's outcome, the ensemble's.
fn deviations() -> Vec<(&'static str, i64, Value, Value)> {
    let devices = json!(["type.googleapis.com/tensorflow.DeviceAttributes"]);
    let no_task = json!({"is_reported_error": false, "source_task": null});
    let barrier_b = |counter: i64| {
        json!({
            "type.googleapis.com/tensorflow.BarrierError": {"barrier_id": "conf/b", "counter": counter},
            "type.googleapis.com/tensorflow.CoordinationServiceError": no_task,
        })
    };
    let mut out = Vec::new();
    // The service incarnation in WaitForAllTasks' answer, which TF 2.21 leaves zero and older
    // TensorFlow releases read.
    for t in [1, 2] {
        out.push((
            "wait_for_all_tasks",
            t,
            json!({"ok": {"devices": devices, "leader_incarnation": "zero"}}),
            json!({"ok": {"devices": devices, "leader_incarnation": "the service's"}}),
        ));
    }
    // Every barrier instance's outcome is kept, so that a call re-driven after a failover gets
    // its instance's answer; TensorFlow keeps the latest instance only (and fails it on a stale
    // counter).
    out.push((
        "barrier_passed_counter_again",
        1,
        json!({"err": "INTERNAL", "payloads": barrier_b(1)}),
        json!({"ok": {"counter": 0}}),
    ));
    out.push((
        "cancel_passed_barrier",
        1,
        json!({"err": "FAILED_PRECONDITION", "payloads": barrier_b(1)}),
        json!({"err": "FAILED_PRECONDITION", "payloads": barrier_b(0)}),
    ));
    // The ensemble has no connection to its tasks: it serves PollForError as TensorFlow's
    // service does in polling mode (the call waits for an error), where TensorFlow's pushes errors
    // and refuses polls.
    out.push((
        "poll_for_error_nothing_yet",
        1,
        json!({"err": "INTERNAL", "payloads": {
            "type.googleapis.com/tensorflow.CoordinationServiceError": no_task}}),
        json!({"err": "CALLER_DEADLINE", "payloads": {}}),
    ));
    // Another task's failure answers a connected task's heartbeats: TF 2.21's agents take it as
    // they take TensorFlow's push (README, "A failed task fails the others").
    out.push((
        "heartbeat_after_another_task_failed",
        1,
        json!({"ok": {"leader_incarnation": "the service's"}}),
        json!({"err": "INTERNAL", "payloads": {
            "type.googleapis.com/tensorflow.CoordinationServiceError":
                {"is_reported_error": true, "source_task": "/job:worker/task:2"}}}),
    ));
    // Sent to TensorFlow's service, it reaches the agent of the task hosting it; a replica is no
    // task's agent.
    out.push((
        "report_error_to_task",
        2,
        json!({"ok": null}),
        json!({"err": "INTERNAL", "payloads": {
            "type.googleapis.com/tensorflow.CoordinationServiceError": no_task}}),
    ));
    out
}

/// The outcome of a line (without its step and task).
fn outcome(line: &Value) -> Value {
    let mut o = line.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("step");
        m.remove("task");
    }
    o
}

/// Line by line: same steps; same outcomes, except the documented deviations, where each side
/// answers as documented.
fn same(theirs: &[Value], ours: &[Value], what: &str) {
    let deviations = deviations();
    let mut deviated = 0;
    for (a, b) in theirs.iter().zip(ours) {
        let context = || {
            format!(
                "{what} answers differently\nTensorFlow's service:\n{}\n{what}:\n{}",
                show(theirs),
                show(ours)
            )
        };
        assert_eq!(
            (&a["step"], &a["task"]),
            (&b["step"], &b["task"]),
            "{}",
            context()
        );
        match deviations
            .iter()
            .find(|d| a["step"] == d.0 && a["task"] == d.1)
        {
            Some((_, _, tf, coord)) => {
                assert_eq!(
                    &outcome(a),
                    tf,
                    "TensorFlow's own answer changed: {}",
                    context()
                );
                assert_eq!(&outcome(b), coord, "{}", context());
                deviated += 1;
            }
            None => assert_eq!(a, b, "{}", context()),
        }
    }
    assert_eq!(
        theirs.len(),
        ours.len(),
        "{what}: a different number of calls"
    );
    assert_eq!(
        deviated,
        deviations.len(),
        "every documented deviation was seen"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_answers_as_tensorflows_own_service() {
    let tf = match Tf::get() {
        Ok(tf) => tf,
        Err(why) => {
            eprintln!("SKIPPED every_rpc_answers_as_tensorflows_own_service: {why}");
            return;
        }
    };
    let theirs = script_against(&tf, Service::TensorFlows).await;

    let mut cluster = ensemble();
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let follower = cluster.replica(cluster.other_than(leader)).grpc.to_string();
    let replica = script_against(&tf, Service::At(&follower)).await;
    same(&theirs, &replica, "a replica");
    let unknown = tf_conformance::unknown_task_state(&follower).await;
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument, "{unknown:?}");
    assert!(
        unknown.message().contains("/job:worker/replica:0/task:9"),
        "the error names the task: {unknown:?}"
    );
    drop(cluster);

    let mut cluster = ensemble();
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let proxy = Sidecar::start(&cluster.endpoints());
    let proxied = script_against(&tf, Service::At(&proxy.addr)).await;
    same(&theirs, &proxied, "coord-proxy");
}

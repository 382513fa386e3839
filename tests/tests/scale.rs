//! Large jobs: every task's WaitForAllTasks answer is the whole job's devices, built once and sent
//! from one buffer (gzipped once for the clients that accept gzip, as TensorFlow's do), by the
//! leader or by a follower relaying the calls; and a job of 20,000 tasks over 100 connections
//! (sidecars carrying 200 tasks each) registers, waits for all, passes a barrier and keeps every
//! task alive across a leader kill. The full sizes and the
//! timings are `coord-bench scale` (docs/benchmarks.md); here nothing is timed.

use std::time::Duration;

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_tests::bench::tasks::{run, summed, Load};
use coord_tests::coord_suite::{w, Env, LEADER_TIMEOUT};
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;

const DEVICE_ATTRIBUTES_URL: &str = "type.googleapis.com/tensorflow.DeviceAttributes";

/// How task `i` sends its one device: TF 2.21's field, or the older releases' (`old`).
fn request(i: i32, old: bool) -> tf::WaitForAllTasksRequest {
    let device = bytes::Bytes::from(format!("dev-{i}"));
    let (device_info, local_device_info) = if old {
        let list = tf::TfDeviceList {
            devices: vec![device],
        };
        let info = tf::CoordinationServiceDeviceInfo {
            r#type: Some(tf::coordination_service_device_info::Type::Tf(list)),
        };
        (None, Some(info))
    } else {
        let any = tf::AnyMessage {
            type_url: DEVICE_ATTRIBUTES_URL.into(),
            value: device,
        };
        (Some(tf::DeviceInfo { device: vec![any] }), None)
    };
    tf::WaitForAllTasksRequest {
        source_task: Some(w(i)),
        device_info,
        local_device_info,
    }
}

/// Every task gets the whole job's devices in the form it reads them, gzipped exactly when it
/// accepts gzip, from the leader or through a follower; each answer compressed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_gets_the_whole_jobs_devices_in_the_form_it_reads() {
    const TASKS: i32 = 300;
    const OLD: i32 = 2;
    let mut env = Env::start(3, &["--job", &format!("worker={TASKS}")]).await;
    for i in 0..TASKS {
        env.client
            .register_task(&w(i), 1 + i as u64)
            .await
            .expect("register");
    }
    let leader = env.cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let follower = env.cluster.other_than(leader);
    let mut channels = Vec::new();
    for id in [leader, follower] {
        let endpoint = format!("http://{}", env.cluster.replica(id).grpc);
        let channel = Channel::from_shared(endpoint).expect("endpoint");
        channels.push(channel.connect().await.expect("connect"));
    }
    let compressions = |env: &Env| {
        [leader, follower].map(|id| env.cluster.metric(id, "coord_answer_compressions_total"))
    };
    let before = compressions(&env);
    let bytes = |env: &Env, name: &str| env.cluster.metric(leader, name);
    let bytes_before = [
        bytes(&env, "coord_answer_compressed_bytes_total"),
        bytes(&env, "coord_answer_gzipped_bytes_total"),
    ];
    let follower_waits = |env: &Env| env.cluster.metric(follower, "coord_relayed_waits_total");
    let waits_before = follower_waits(&env);
    // Even tasks accept gzip (as TF's clients do), odd ones do not; tasks 2-3 of every four call
    // a follower, which relays their calls to the leader; the last OLD tasks send their device as
    // releases before 2.1x did.
    let calls: Vec<_> = (0..TASKS)
        .map(|i| {
            let channel = channels[(i as usize / 2) % 2].clone();
            let mut c = CoordinationServiceClient::new(channel).max_decoding_message_size(64 << 20);
            if i % 2 == 0 {
                c = c.accept_compressed(CompressionEncoding::Gzip);
            }
            let req = request(i, i >= TASKS - OLD);
            tokio::spawn(async move { c.wait_for_all_tasks(req).await })
        })
        .collect();
    let expected: Vec<bytes::Bytes> = (0..TASKS)
        .map(|i| bytes::Bytes::from(format!("dev-{i}")))
        .collect();
    let mut first: Option<tf::WaitForAllTasksResponse> = None;
    for (i, call) in (0..TASKS).zip(calls) {
        let answer = call.await.expect("join").expect("WaitForAllTasks");
        let encoding = answer
            .metadata()
            .get("grpc-encoding")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        assert_eq!(
            encoding.as_deref(),
            (i % 2 == 0).then_some("gzip"),
            "task {i}: gzip exactly when accepted"
        );
        let answer = answer.into_inner();
        if i >= TASKS - OLD {
            assert_eq!(
                answer.device_info, None,
                "task {i}: an older client's answer"
            );
            match answer.cluster_device_info.and_then(|d| d.r#type) {
                Some(tf::coordination_service_device_info::Type::Tf(l)) => {
                    assert_eq!(l.devices, expected, "task {i}: every device, in task order")
                }
                other => panic!("task {i}: {other:?}"),
            }
            continue;
        }
        assert_eq!(
            answer.cluster_device_info, None,
            "task {i}: 2.21 reserves field 3"
        );
        let devices = answer.device_info.clone().expect("device_info").device;
        assert!(devices.iter().all(|d| d.type_url == DEVICE_ATTRIBUTES_URL));
        let values: Vec<_> = devices.into_iter().map(|d| d.value).collect();
        assert_eq!(values, expected, "task {i}: every device, in task order");
        match &first {
            Some(f) => assert_eq!(&answer, f, "task {i}: the same answer as task 0's"),
            None => first = Some(answer),
        }
    }
    // Each answer compressed once for all its callers: on the leader the one form its callers
    // accepting gzip read; on the follower, which relays the same bytes for every caller, that
    // form and the older releases' (task 298's).
    let after = compressions(&env);
    assert_eq!(
        [after[0] - before[0], after[1] - before[1]],
        [1.0, 2.0],
        "answers compressed by the leader and by the follower"
    );
    // The leader's one gzip of the answer, shorter than the answer (300 devices of 7-byte
    // values, each wrapped with its type URL) and counted as sent.
    let plain = bytes(&env, "coord_answer_compressed_bytes_total") - bytes_before[0];
    let gzipped = bytes(&env, "coord_answer_gzipped_bytes_total") - bytes_before[1];
    assert!(
        gzipped > 0.0 && gzipped < plain,
        "gzipped {gzipped} of {plain} bytes"
    );
    // The follower recorded each caller's arrival on the leader and fetched the devices once per
    // form its callers read (TF 2.21's and the older releases'), not once per caller (150
    // copies). A caller whose arrival completed the gathering may look after every other caller
    // of its form had its answer: then a second fetch, answered at once.
    let fetched = follower_waits(&env) - waits_before;
    assert!(
        (2.0..=4.0).contains(&fetched),
        "the follower fetched the devices {fetched} times for its 150 callers of 2 forms"
    );
    assert_eq!(
        env.cluster.metric(follower, "coord_relayed_waiting_calls"),
        0.0
    );
}

/// The job `coord-bench tasks` measures, at CI size: nothing timed, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_tasks_register_wait_pass_a_barrier_and_outlive_a_leader_kill() {
    let load = Load {
        tasks: 20_000,
        connections: 100,
        device_bytes: 0,
        heartbeat_every: Duration::from_secs(10),
        cpu_window: Duration::from_secs(1),
        arrivals_per_second: 0,
        // Each connection's tasks' heartbeats sent together, as coord-proxy sends them: through
        // the leader's kill too.
        heartbeat_batch: Duration::from_millis(200),
        // And their barrier and WaitForAllTasks arrivals recorded together, each sidecar waiting
        // with one call and fetching the job's devices once.
        arrivals_together: true,
    };
    let mut env = Env::start(
        3,
        &[
            "--job",
            &format!("worker={}", load.tasks),
            // Debug builds on a loaded CI machine: a dead task is not what this looks for.
            "--heartbeat-timeout-ms",
            "120000",
            // Nor is a leader deposed by its own load: a debug build holding 40,000 parked calls
            // on two busy cores misses the 300 ms lease, and each election re-drives every parked
            // call at once (CI failed it so). Timeouts as an operator of a loaded machine sets them.
            "--heartbeat-ms",
            "200",
            "--election-timeout-min-ms",
            "1500",
            "--election-timeout-max-ms",
            "3000",
        ],
    )
    .await;
    let leader = env.cluster.wait_for_leader(LEADER_TIMEOUT).await;
    let pid = env.cluster.pid(leader).expect("leader pid");
    let endpoints = env.cluster.endpoints();
    let report = run(endpoints, &load, pid, summed(&env.cluster), || {
        env.cluster.kill(leader)
    })
    .await
    .expect("the job ran");
    assert_eq!(
        report.heartbeat_errors, 0,
        "failed heartbeats before the kill"
    );
    assert_eq!(
        report.heartbeat_errors_after_kill, 0,
        "failed heartbeats after the kill: a task declared dead fails them all"
    );
    assert!(
        report.heartbeat_calls_per_second < report.heartbeats_per_second,
        "heartbeats sent together: {:.0} a second in {:.0} calls",
        report.heartbeats_per_second,
        report.heartbeat_calls_per_second
    );
    // The devices came once per sidecar (twice where its last arrival's answer came after its
    // first fetch's), each answer carrying the job's devices: none, one empty DeviceInfo.
    assert!(
        (1..=2 * load.connections as u64).contains(&report.wait_for_all_fetches),
        "{} fetches of the job's devices by {} sidecars",
        report.wait_for_all_fetches,
        load.connections
    );
    assert_eq!(
        report.wait_for_all_bytes,
        report.wait_for_all_fetches * answer_size()
    );
}

/// The size on the wire of an answer with no devices: the gRPC frame prefix, the incarnation
/// (field 1, fixed64) and an empty device list (field 4). Sent plain although the tasks accept
/// gzip: compressed, it would be larger.
fn answer_size() -> u64 {
    5 + 9 + 2
}

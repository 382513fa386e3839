//! The suite's checks of barrier arrivals recorded together: `coord.coordination.Coordination/
//! BarrierArrivals` answers each arrival as TensorFlow's own Barrier call of that task would be
//! answered (or pending, while its instance waits), `AwaitBarrier` answers every task pending at
//! an instance, and coord-proxy sends its tasks' Barrier calls so.

use std::collections::BTreeMap;

use coord_agent::proxy::barriers::WaitBatches;
use coord_agent::CoordClient;
use coord_proto::coord::coordination::BarrierAnswer;
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_proto::tensorflow::distributed_runtime::{GrpcPayloadContainer, BARRIER_ERROR_URL};
use prost::Message;
use tonic::Code;

use super::env::{assert_code, ok_calls, register_all, tf_devices, w, Env};
use super::sidecar::{every_task, through_a_sidecar, TASKS};

/// A call's outcome as the tests compare them: the counter, or the code, message and the
/// payloads of the status details (TensorFlow's payload container is a map, encoded in no fixed
/// order).
type Outcome = Result<i64, (Code, String, BTreeMap<String, Vec<u8>>)>;

/// The payloads of `details`, TensorFlow's `GrpcPayloadContainer`.
fn payloads(details: &[u8]) -> BTreeMap<String, Vec<u8>> {
    GrpcPayloadContainer::decode(details)
        .expect("status details are a GrpcPayloadContainer")
        .payloads
        .into_iter()
        .map(|(url, v)| (url, v.to_vec()))
        .collect()
}

/// A failed call's outcome.
fn failed(s: &tonic::Status) -> (Code, String, BTreeMap<String, Vec<u8>>) {
    (s.code(), s.message().to_string(), payloads(s.details()))
}

fn arrival(
    id: &str,
    counter: i64,
    timeout_ms: i64,
    source: Option<tf::CoordinatedTask>,
) -> tf::BarrierRequest {
    tf::BarrierRequest {
        barrier_id: id.into(),
        barrier_timeout_in_ms: timeout_ms,
        tasks: Vec::new(),
        source_task: source,
        counter,
    }
}

/// A decided answer as a call's outcome; None while pending.
fn outcome(a: &BarrierAnswer) -> Option<Outcome> {
    if a.pending {
        return None;
    }
    Some(if a.error_code == 0 {
        Ok(a.counter)
    } else {
        Err((
            Code::from_i32(a.error_code),
            a.error_message.clone(),
            payloads(&a.error_details),
        ))
    })
}

/// Asserts that the arrivals, sent together, passed instance `counter`: the one recorded last
/// passed it, the others passed it too or are pending there.
fn passes(answers: &[BarrierAnswer], counter: i64) {
    let outcomes: Vec<_> = answers.iter().map(outcome).collect();
    assert!(outcomes.contains(&Some(Ok(counter))), "{answers:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| o.is_none() || *o == Some(Ok(counter))),
        "{answers:?}"
    );
}

/// `req` as the task's own TensorFlow Barrier call.
async fn own_call(c: &CoordClient, req: tf::BarrierRequest) -> Outcome {
    c.forward(req, true, true, |ch, r| async move {
        CoordinationServiceClient::new(ch).barrier(r).await
    })
    .await
    .map(|r| r.counter)
    .map_err(|s| failed(&s))
}

pub async fn barrier_arrivals_recorded_together(replicas: usize) {
    let env = Env::start(replicas, &["--job", "worker=4"]).await;
    let c = &env.client.clone();
    register_all(c, 4).await;
    let t = 20_000;

    // Two of four arrive: pending, and recorded once however often sent.
    let first = c
        .barrier_arrivals(vec![
            arrival("step", 0, t, Some(w(0))),
            arrival("step", 0, t, Some(w(1))),
        ])
        .await
        .expect("arrivals");
    assert!(
        first.iter().all(|a| a.pending && a.counter == 0),
        "{first:?}"
    );
    let waiting = {
        let c = env.another_client();
        tokio::spawn(async move { c.await_barrier("step", 0).await })
    };
    let again = c
        .barrier_arrivals(vec![arrival("step", 0, t, Some(w(0)))])
        .await
        .expect("again");
    assert!(again[0].pending, "{again:?}");
    // The last two together: the last one's arrival passes the instance.
    let last = c
        .barrier_arrivals(vec![
            arrival("step", 0, t, Some(w(2))),
            arrival("step", 0, t, Some(w(3))),
        ])
        .await
        .expect("last arrivals");
    passes(&last, 0);
    let passed = waiting.await.expect("join").expect("await");
    assert_eq!(outcome(&passed), Some(Ok(0)), "{passed:?}");
    // A passed instance: stored answers at once, as a task's own call gets them.
    assert_eq!(own_call(c, arrival("step", 0, t, Some(w(1)))).await, Ok(0));
    let stored = c.await_barrier("step", 0).await.expect("stored");
    assert_eq!(outcome(&stored), Some(Ok(0)));

    // Wrong arrivals are answered as their own calls are, code, message and details alike, and
    // each by itself: the good one beside them is recorded.
    let wrong = vec![
        arrival("bad", -1, t, Some(w(0))),
        arrival("bad", 0, t, Some(w(9))),
        arrival("bad", 0, t, None),
        arrival("", 0, t, Some(w(0))),
        arrival("bad", 0, -5, Some(w(1))),
        arrival("good", 0, t, Some(w(0))),
    ];
    let answers = c
        .barrier_arrivals(wrong.clone())
        .await
        .expect("wrong arrivals");
    assert_eq!(answers.len(), wrong.len(), "one answer per arrival");
    assert!(answers[5].pending, "{:?}", answers[5]);
    for (req, a) in wrong.into_iter().zip(&answers).take(5) {
        let together = outcome(a).expect("decided");
        assert!(together.is_err(), "{req:?}: {together:?}");
        assert_eq!(together, own_call(c, req.clone()).await, "{req:?}");
    }
    assert!(
        matches!(outcome(&answers[1]), Some(Err((Code::InvalidArgument, m, _))) if m.contains("tasks 0..3"))
    );
    assert!(
        matches!(outcome(&answers[2]), Some(Err((Code::InvalidArgument, m, _))) if m.contains("source_task"))
    );

    // An instance that times out: every task pending there gets the failure its own call would,
    // TensorFlow's BarrierError among the details.
    let pending = c
        .barrier_arrivals(vec![arrival("slow", 0, 700, Some(w(0)))])
        .await
        .expect("slow");
    assert!(pending[0].pending);
    let timed_out = c.await_barrier("slow", 0).await.expect("await slow");
    let timed_out = outcome(&timed_out).expect("decided");
    assert!(
        matches!(&timed_out, Err((Code::DeadlineExceeded, _, d)) if d.contains_key(BARRIER_ERROR_URL)),
        "{timed_out:?}"
    );
    assert_eq!(
        timed_out,
        own_call(c, arrival("slow", 0, 700, Some(w(0)))).await
    );

    // Waiting on what no wait can end, or naming no barrier, is the call's own error.
    assert_code(
        c.await_barrier("", 0).await,
        Code::InvalidArgument,
        "must not be empty",
    );
    assert_code(
        c.await_barrier("step", -1).await,
        Code::InvalidArgument,
        "counter -1 is negative",
    );
    for counter in 1..=5 {
        let all = (0..4)
            .map(|i| arrival("step", counter, t, Some(w(i))))
            .collect();
        passes(&c.barrier_arrivals(all).await.expect("instance"), counter);
    }
    assert_code(
        c.await_barrier("step", 0).await,
        Code::FailedPrecondition,
        "instance 0 finished long ago",
    );
    assert_code(
        c.barrier_arrivals(vec![arrival("step", 6, t, Some(w(0))); 65_537])
            .await,
        Code::ResourceExhausted,
        "65537 arrivals in one call, over the limit of 65536",
    );
}

/// The Barrier calls coord-proxy's tasks send are recorded together and answered from one wait,
/// each task answered as its own call would be.
pub async fn a_sidecar_records_its_tasks_barrier_arrivals_together(replicas: usize) {
    let (mut env, _sidecar, tf) = through_a_sidecar(replicas).await;
    let c = &env.client.clone();
    let answers = every_task(&tf, |mut tf, i| async move {
        tf.barrier(arrival("step", 0, 30_000, Some(w(i)))).await
    })
    .await;
    for answer in answers {
        assert_eq!(answer.counter, 0);
    }
    // A barrier that times out fails through the sidecar as it does without it.
    let mut alone = tf.clone();
    let through = alone
        .barrier(arrival("slow", 0, 500, Some(w(0))))
        .await
        .map(|r| r.into_inner().counter)
        .map_err(|s| failed(&s));
    assert!(
        matches!(&through, Err((Code::DeadlineExceeded, _, d)) if d.contains_key(BARRIER_ERROR_URL)),
        "{through:?}"
    );
    assert_eq!(
        through,
        own_call(c, arrival("slow", 0, 500, Some(w(0)))).await
    );
    // The leader counts the calls: no task's Barrier call went on its own, and the eight waited
    // on fewer calls than eight.
    let waits = env.counted_ok("coordination/AwaitBarrier", 2).await;
    assert!(
        (2..TASKS as u64).contains(&waits),
        "{TASKS} tasks at one barrier and one at another waited in {waits} calls"
    );
    // (The test's own call above failed: it is not counted with code OK.)
    assert_eq!(
        ok_calls(&env.cluster, "Barrier"),
        0,
        "no task's Barrier call went on its own"
    );
}

/// Task `i`'s WaitForAllTasks as TensorFlow before 2.21 sends it (its devices in
/// `local_device_info`), or with none.
fn wait_request(i: i32, devices: bool) -> tf::WaitForAllTasksRequest {
    tf::WaitForAllTasksRequest {
        source_task: Some(w(i)),
        local_device_info: devices.then(|| tf_devices(&format!("dev{i}"))),
        device_info: None,
    }
}

/// `req` as the task's own TensorFlow WaitForAllTasks call.
async fn own_wait(
    c: &CoordClient,
    req: tf::WaitForAllTasksRequest,
) -> Result<tf::WaitForAllTasksResponse, (Code, String, BTreeMap<String, Vec<u8>>)> {
    c.forward(req, true, true, |ch, r| async move {
        CoordinationServiceClient::new(ch)
            .wait_for_all_tasks(r)
            .await
    })
    .await
    .map_err(|s| failed(&s))
}

pub async fn wait_for_all_arrivals_recorded_together(replicas: usize) {
    let env = Env::start(replicas, &["--job", "worker=3"]).await;
    let c = &env.client.clone();
    register_all(c, 3).await;
    // Wrong arrivals answered as their own calls are, beside two recorded ones.
    let first = vec![
        wait_request(0, true),
        wait_request(9, true),
        tf::WaitForAllTasksRequest {
            source_task: None,
            ..wait_request(1, true)
        },
        wait_request(1, true),
    ];
    let answers = c
        .wait_for_all_arrivals(first.clone())
        .await
        .expect("arrivals");
    assert_eq!(answers.len(), first.len(), "one answer per arrival");
    assert!(answers[0].pending && answers[3].pending, "{answers:?}");
    for i in [1, 2] {
        let together = outcome(&answers[i]).expect("decided");
        assert!(together.is_err(), "{together:?}");
        let alone = own_wait(c, first[i].clone()).await.map(|_| 0);
        assert_eq!(together, alone, "arrival {i}");
    }
    // The last one gathers the job; then every task's own call answers at once, the same for all,
    // with every task's devices.
    let last = c
        .wait_for_all_arrivals(vec![wait_request(2, true)])
        .await
        .expect("last");
    assert_eq!(outcome(&last[0]), Some(Ok(0)), "{last:?}");
    let mut seen = None;
    for i in 0..3 {
        let answer = own_wait(c, wait_request(i, true)).await.expect("gathered");
        match &seen {
            Some(s) => assert_eq!(&answer, s, "task {i}: the same answer as task 0's"),
            None => seen = Some(answer),
        }
    }
    let devices = match seen
        .and_then(|a| a.cluster_device_info)
        .and_then(|d| d.r#type)
    {
        Some(tf::coordination_service_device_info::Type::Tf(list)) => list.devices,
        other => panic!("{other:?}"),
    };
    assert_eq!(devices.len(), 3, "every task's devices");
    assert_code(
        c.wait_for_all_arrivals(vec![wait_request(0, false); 65_537])
            .await,
        Code::ResourceExhausted,
        "65537 arrivals in one call, over the limit of 65536",
    );
}

/// The WaitForAllTasks calls coord-proxy's tasks send are recorded together and the job's devices
/// fetched once for all of them, each task answered as its own call would be.
pub async fn a_sidecar_fetches_the_jobs_devices_once(replicas: usize) {
    let (mut env, _sidecar, tf) = through_a_sidecar(replicas).await;
    let c = &env.client.clone();
    let answers = every_task(&tf, |mut tf, i| async move {
        tf.wait_for_all_tasks(wait_request(i, true)).await
    })
    .await;
    let direct = own_wait(c, wait_request(0, true)).await.expect("direct");
    for (i, a) in answers.iter().enumerate() {
        assert_eq!(a, &direct, "task {i}: its own call's answer");
    }
    // The leader counts the calls: the eight arrivals were recorded together, and the devices
    // came in one task's call through the sidecar, or two (the last arrival's answer may come
    // after the first fetch was answered); one more is this test's own, direct.
    let recorded = env
        .counted_ok("coordination/WaitForAllTasksArrivals", 1)
        .await;
    assert!(
        (1..TASKS as u64).contains(&recorded),
        "{TASKS} arrivals recorded in {recorded} calls"
    );
    let fetched = ok_calls(&env.cluster, "WaitForAllTasks");
    assert!(
        (2..=3).contains(&fetched),
        "the devices fetched {fetched} times, the test's own call among them"
    );
}

/// A sidecar hands its tasks the job's devices as the bytes its one fetch brought, one buffer for
/// all of them, not a decoded tree copied for each (10,000 tasks' copies of 10,000 devices took
/// seconds); each decodes as the task's own call's answer.
pub async fn a_sidecars_tasks_share_one_answer(replicas: usize) {
    let env = Env::start(replicas, &["--job", &format!("worker={TASKS}")]).await;
    let c = &env.client.clone();
    register_all(c, TASKS).await;
    let sidecar = std::sync::Arc::new(WaitBatches::new(true));
    let calls: Vec<_> = (0..TASKS)
        .map(|i| {
            let (sidecar, c) = (sidecar.clone(), c.clone());
            tokio::spawn(async move { sidecar.send(&c, wait_request(i, true)).await })
        })
        .collect();
    let mut answers = Vec::new();
    for (i, call) in calls.into_iter().enumerate() {
        let answer = call.await.expect("join");
        answers.push(answer.unwrap_or_else(|s| panic!("task {i}: {s:?}")));
    }
    let direct = own_wait(c, wait_request(0, true)).await.expect("direct");
    let mut buffers = std::collections::BTreeSet::new();
    for (i, a) in answers.iter().enumerate() {
        assert!(
            !a.encoded.is_empty(),
            "task {i}: handed the bytes as they came"
        );
        buffers.insert(a.encoded.as_ptr() as usize);
        let decoded = tf::WaitForAllTasksResponse::decode(a.encoded.clone()).expect("decodes");
        assert_eq!(decoded, direct, "task {i}: its own call's answer");
    }
    // One buffer per fetch: the devices came in one call, or two (a task whose arrival was
    // answered after the first fetch had returned).
    assert_eq!(buffers.len() as u64, sidecar.waits(), "{buffers:?}");
    assert!(
        (1..=2).contains(&sidecar.waits()),
        "{} fetches",
        sidecar.waits()
    );
}

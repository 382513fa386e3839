//! The suite's checks of heartbeats sent together: `coord.coordination.Coordination/Heartbeats`,
//! which a sidecar carrying several tasks sends, answers each beat exactly as TensorFlow's own
//! Heartbeat call of that task; coord-proxy holds its tasks' heartbeats and sends them so.

use coord_agent::CoordClient;
use coord_proto::coord::coordination::{Beat, BeatAnswer};
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use tonic::Code;

use super::env::{assert_code, ok_calls, register_all, w, Env};

fn beat(task: tf::CoordinatedTask, incarnation: u64) -> Beat {
    Beat {
        task: Some(task),
        incarnation,
    }
}

/// A beat's answer as a call's outcome: the incarnation, or the code, message and details.
fn outcome(a: &BeatAnswer) -> Result<u64, (Code, String, Vec<u8>)> {
    if a.error_code == 0 {
        return Ok(a.leader_incarnation);
    }
    Err((
        Code::from_i32(a.error_code),
        a.error_message.clone(),
        a.error_details.to_vec(),
    ))
}

/// Sends `beats` together and each on its own; the answers must be the same, code, message and
/// status details alike. Returns the answers.
async fn same_as_alone(c: &CoordClient, beats: Vec<Beat>) -> Vec<BeatAnswer> {
    let answers = c.heartbeats(beats.clone()).await.expect("heartbeats");
    assert_eq!(answers.len(), beats.len(), "one answer per beat");
    for (b, a) in beats.iter().zip(&answers) {
        let task = b.task.as_ref().expect("task");
        let alone = c
            .heartbeat(task, b.incarnation)
            .await
            .map_err(|s| (s.code(), s.message().to_string(), s.details().to_vec()));
        assert_eq!(
            outcome(a),
            alone,
            "{task:?} with incarnation {}",
            b.incarnation
        );
    }
    answers
}

pub async fn heartbeats_sent_together(replicas: usize) {
    let env = Env::start(replicas, &["--job", "worker=3"]).await;
    let c = &env.client.clone();
    let incarnation = register_all(c, 3).await;
    let answers = same_as_alone(
        c,
        vec![
            beat(w(0), 100),
            beat(w(1), 999),
            beat(w(7), 1),
            beat(w(2), 102),
        ],
    )
    .await;
    let codes: Vec<_> = answers.iter().map(outcome).collect();
    assert_eq!(codes[0], Ok(incarnation));
    assert!(matches!(&codes[1], Err((Code::Aborted, m, _)) if m.contains("restarted")));
    assert!(matches!(&codes[2], Err((Code::InvalidArgument, m, _)) if m.contains("tasks 0..2")));
    assert_eq!(codes[3], Ok(incarnation));

    // A beat naming no task is refused by itself, naming its place; the others are answered.
    let no_task = Beat {
        task: None,
        incarnation: 1,
    };
    let answers = c
        .heartbeats(vec![beat(w(0), 100), no_task])
        .await
        .expect("heartbeats");
    assert_eq!(outcome(&answers[0]), Ok(incarnation));
    assert!(
        matches!(outcome(&answers[1]), Err((Code::InvalidArgument, m, _)) if m.contains("beats[1].task is missing")),
        "{:?}",
        answers[1]
    );

    // Another task's failure: each task's beat carries what its own call would, TensorFlow's
    // payload naming the failed task included.
    c.report_error(&w(2), Code::Internal as i32, "disk on fire")
        .await
        .expect("report");
    let answers = same_as_alone(c, vec![beat(w(0), 100), beat(w(2), 102)]).await;
    assert!(
        matches!(outcome(&answers[0]), Err((Code::Internal, m, d)) if m.contains("disk on fire") && !d.is_empty())
    );
    assert!(
        matches!(outcome(&answers[1]), Err((Code::Aborted, m, _)) if m.contains("already in error"))
    );

    // None is fine; more than the limit is refused whole, naming it.
    assert!(c.heartbeats(Vec::new()).await.expect("empty").is_empty());
    assert_code(
        c.heartbeats(vec![beat(w(0), 100); 65_537]).await,
        Code::ResourceExhausted,
        "65537 beats in one call, over the limit of 65536",
    );
}

/// The heartbeats coord-proxy's tasks send at once go to the ensemble as fewer calls, each task
/// answered as its own call would be.
pub async fn a_sidecar_sends_its_tasks_heartbeats_together(replicas: usize) {
    const TASKS: i32 = 8;
    let mut env = Env::start(replicas, &["--job", &format!("worker={TASKS}")]).await;
    let c = &env.client.clone();
    // The sidecar first: the tasks' heartbeat timeouts run from their registration.
    let sidecar = crate::jax::Sidecar::start_with(
        &env.cluster.endpoints(),
        &["--heartbeat-batch-ms".to_string(), "500".to_string()],
    );
    let incarnation = register_all(c, TASKS).await;
    let tf = CoordinationServiceClient::connect(format!("http://{}", sidecar.addr))
        .await
        .expect("connect to the sidecar");
    let beats: Vec<_> = (0..TASKS)
        .map(|i| {
            let mut tf = tf.clone();
            tokio::spawn(async move {
                tf.heartbeat(tf::HeartbeatRequest {
                    incarnation: 100 + i as u64,
                    source_task: Some(w(i)),
                })
                .await
            })
        })
        .collect();
    for b in beats {
        let answer = b
            .await
            .expect("join")
            .expect("heartbeat through the sidecar");
        assert_eq!(answer.into_inner().leader_incarnation, incarnation);
    }
    // A restarted task's heartbeat is refused through the sidecar as it is without it.
    let mut alone = tf.clone();
    let refused = alone
        .heartbeat(tf::HeartbeatRequest {
            incarnation: 999,
            source_task: Some(w(1)),
        })
        .await;
    let direct = c.heartbeat(&w(1), 999).await;
    match (refused, direct) {
        (Err(a), Err(b)) => {
            assert_eq!((a.code(), a.message()), (b.code(), b.message()));
            assert_eq!(a.code(), Code::Aborted);
        }
        other => panic!("both must be refused: {other:?}"),
    }
    // The leader counts the calls: the eight heartbeats came as fewer than eight.
    let batched = env.counted_ok("coordination/Heartbeats", 1).await;
    assert!(
        (1..TASKS as u64).contains(&batched),
        "{TASKS} heartbeats sent in {batched} calls"
    );
    assert_eq!(
        ok_calls(&env.cluster, "Heartbeat"),
        0,
        "no heartbeat went on its own"
    );
}

//! The suite's checks of reads a sidecar's tasks send alike: coord-proxy sends one call for its
//! tasks' waits on one key (as every JAX process waits on the topology) and for their reads of
//! one directory, and each task gets the answer its own call would have had.

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;

use super::sidecar::{every_task, through_a_sidecar, TASKS};

fn entry(key: &str, value: &str) -> tf::KeyValueEntry {
    tf::KeyValueEntry {
        key: key.into(),
        value: value.as_bytes().to_vec().into(),
    }
}

pub async fn a_sidecar_reads_alike_keys_once(replicas: usize) {
    let (mut env, _sidecar, tf) = through_a_sidecar(replicas).await;
    // Every task waits on the key before it is there.
    let waiting = {
        let tf = tf.clone();
        tokio::spawn(async move {
            every_task(&tf, |mut tf, _| async move {
                let key = "topology".into();
                tf.get_key_value(tf::GetKeyValueRequest { key }).await
            })
            .await
        })
    };
    env.wait_parked(1).await;
    let insert = |kv| tf::InsertKeyValueRequest {
        kv: Some(kv),
        allow_overwrite: false,
    };
    let mut writer = tf.clone();
    writer
        .insert_key_value(insert(entry("topology", "8 hosts")))
        .await
        .expect("insert");
    for (i, answer) in waiting.await.expect("join").into_iter().enumerate() {
        assert_eq!(answer.kv, Some(entry("topology", "8 hosts")), "task {i}");
    }
    // The leader counts the calls: the tasks that came while the first wait was parked went in
    // one more call, answered at once (a task late to both makes a third).
    let waits = env.counted_ok("GetKeyValue", 1).await;
    assert!(
        (1..=3).contains(&waits),
        "{TASKS} tasks' waits on one key in {waits} calls"
    );
    // A directory every task reads: each gets a direct call's answer.
    for (key, value) in [("dir/a", "1"), ("dir/b", "2"), ("dir/c/d", "3")] {
        writer
            .insert_key_value(insert(entry(key, value)))
            .await
            .expect("insert");
    }
    let dir = || tf::GetKeyValueDirRequest {
        directory_key: "dir".into(),
    };
    let read = every_task(&tf, |mut tf, _| {
        let req = dir();
        async move { tf.get_key_value_dir(req).await }
    })
    .await;
    let direct = env
        .client
        .forward(dir(), false, false, |ch, r| async move {
            CoordinationServiceClient::new(ch)
                .get_key_value_dir(r)
                .await
        })
        .await
        .expect("direct");
    assert_eq!(direct.kv.len(), 3, "{direct:?}");
    for (i, answer) in read.iter().enumerate() {
        assert_eq!(answer, &direct, "task {i}: a direct call's answer");
    }
}

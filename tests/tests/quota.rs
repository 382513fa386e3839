//! The memory quota on the replicated state (`--quota-bytes`): a client writing far more than the
//! quota fills it, is refused with a message naming the quota, the alarm shows wherever an
//! operator looks, replica memory stays bounded, and the ensemble keeps serving; deletes clear it.

use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_tests::bench::tasks::rss_bytes;
use coord_tests::cli::coordctl_json;
use coord_tests::cluster::{Cluster, ClusterOptions};
use coord_tests::http;
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(60);
const MIB: usize = 1 << 20;
const QUOTA: usize = 32 * MIB;

fn metric_line(c: &Cluster, id: u64, line: &str) -> bool {
    http::get(c.replica(id).http, "/metrics").is_ok_and(|(_, m)| m.lines().any(|l| l == line))
}

fn rss_of_all(c: &Cluster) -> Vec<u64> {
    c.replicas
        .iter()
        .map(|r| {
            c.pid(r.id)
                .and_then(rss_bytes)
                .expect("a running replica's RSS")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_filling_the_store_hits_the_quota_and_the_ensemble_keeps_serving() {
    let mut c = Cluster::start(ClusterOptions {
        extra_args: vec!["--quota-bytes".into(), QUOTA.to_string()],
        ..ClusterOptions::default()
    });
    let leader = c.wait_for_leader(TIMEOUT).await;
    let eps = c.endpoints();
    let cl = CoordClient::new(ClientOptions::new(eps.clone())).expect("client");
    // The leader puts its flag in force.
    c.wait_until(TIMEOUT, "the quota replicated", |c| {
        c.replicas
            .iter()
            .all(|r| metric_line(c, r.id, &format!("coord_quota_bytes {QUOTA}")))
    })
    .await;
    cl.insert("warm", "up", false).await.expect("insert");
    let before = rss_of_all(&c);

    // 1 MiB values until the quota refuses one.
    let value = Bytes::from(vec![b'x'; MIB]);
    let mut stored = 0;
    let refused = loop {
        match cl
            .insert(&format!("fill/{stored}"), value.clone(), false)
            .await
        {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored < 64, "{stored} MiB stored under a 32 MiB quota");
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains(&format!("{QUOTA}-byte quota (--quota-bytes)"))
            && refused.message().contains(&format!("\"fill/{stored}\"")),
        "{refused:?}"
    );
    println!("stored {stored} values of 1 MiB under the 32 MiB quota");
    assert!(
        (28..32).contains(&stored),
        "{stored} MiB fitted a 32 MiB quota"
    );

    // The alarm, wherever an operator looks.
    c.wait_until(TIMEOUT, "the alarm on every replica", |c| {
        c.replicas
            .iter()
            .all(|r| metric_line(c, r.id, "coord_quota_alarm 1"))
    })
    .await;
    let (_, status) = http::get(c.replica(leader).http, "/status").expect("/status");
    let status: serde_json::Value = serde_json::from_str(&status).expect("json");
    assert_eq!(status["quota_alarm"], true, "{status}");
    assert!(
        status["state_bytes"].as_u64().unwrap_or(0) <= QUOTA as u64,
        "{status}"
    );
    let rows = coordctl_json(&eps, &["status"]);
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r["alarm"] == "NOSPACE"), "{rows:?}");
    let (_, overview) = http::get(c.replica(leader).http, "/api/overview").expect("overview");
    assert!(overview.contains("memory quota alarm"), "{overview}");

    // A hostile writer keeps going: 7x the quota offered in all. Every write is refused at
    // once, before it reaches the Raft log.
    let log_before = c.metric(leader, "coord_raft_last_log_index");
    for i in 0..200 {
        let err = cl
            .insert(&format!("more/{i}"), value.clone(), false)
            .await
            .expect_err("past the quota");
        assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    }
    let log_growth = c.metric(leader, "coord_raft_last_log_index") - log_before;
    println!("200 refused writes grew the log by {log_growth} entries");
    assert!(
        log_growth < 10.0,
        "refused writes grew the log by {log_growth} entries"
    );
    let after = rss_of_all(&c);
    for (b, a) in before.iter().zip(&after) {
        let grew = a.saturating_sub(*b);
        println!("replica RSS {} MiB -> {} MiB", b >> 20, a >> 20);
        // Without the quota each replica would hold 232 MiB of values.
        assert!(
            grew < (5 * QUOTA) as u64,
            "a replica grew by {} MiB",
            grew >> 20
        );
    }

    // Reads, same-size overwrites and deletes still work.
    assert_eq!(
        cl.try_get("fill/0").await.expect("read"),
        Some(value.clone())
    );
    cl.insert("fill/0", value.clone(), true)
        .await
        .expect("an overwrite that does not grow");
    for i in 0..10 {
        cl.delete(&format!("fill/{i}")).await.expect("delete");
    }
    // Below 95% of the quota the alarm clears everywhere and writes fit again.
    c.wait_until(TIMEOUT, "the alarm cleared on every replica", |c| {
        c.replicas
            .iter()
            .all(|r| metric_line(c, r.id, "coord_quota_alarm 0"))
    })
    .await;
    cl.insert("after", value.clone(), false)
        .await
        .expect("room made");
    let rows = coordctl_json(&eps, &["status"]);
    assert!(
        rows.as_array()
            .expect("rows")
            .iter()
            .all(|r| r["alarm"].is_null()),
        "{rows}"
    );
    // Every replica counts the same bytes (apply decides from the state alone).
    let bytes = c.settled_state_bytes(TIMEOUT).await;
    assert!(bytes > (20 * MIB) as u64 && bytes < QUOTA as u64, "{bytes}");
}

//! The HTTP port of a live ensemble: health and readiness as quorum comes and goes, `/status`,
//! and `/metrics` that follow Prometheus' conventions.

use std::time::Duration;

use coord_tests::{http, Cluster, ClusterOptions};

use super::{started, LEADER_TIMEOUT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints_report_health_and_status() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(LEADER_TIMEOUT).await;
    c.wait_until(Duration::from_secs(30), "every replica to be ready", |c| {
        c.ids()
            .iter()
            .all(|&id| http::get(c.replica(id).http, "/readyz").is_ok_and(|(code, _)| code == 200))
    })
    .await;
    for id in c.ids() {
        let r = c.replica(id);
        assert_eq!(http::get(r.http, "/livez").expect("livez").0, 200);
        let s = c.status(id).expect("status");
        assert_eq!(s.id, id);
        assert_eq!(s.leader_id, Some(leader));
        let (code, body) = http::get(r.http, "/status").expect("status");
        assert_eq!(code, 200);
        let v: serde_json::Value = serde_json::from_str(&body).expect("json");
        assert_eq!(v["members"].as_array().map(Vec::len), Some(3));
        let (code, metrics) = http::get(r.http, "/metrics").expect("metrics");
        assert_eq!(code, 200);
        for name in [
            "coord_raft_term",
            "coord_log_sync_seconds_bucket",
            "coord_commit_latency_seconds_count",
            "coord_parked_calls",
        ] {
            assert!(metrics.contains(name), "{name} missing from /metrics");
        }
    }
    // With two replicas down, nobody is ready: no quorum, no leader.
    let others: Vec<u64> = c.ids().into_iter().filter(|&i| i != leader).collect();
    for id in &others {
        c.kill(*id);
    }
    c.wait_until(
        Duration::from_secs(30),
        "the lone replica to report not ready",
        |c| http::get(c.replica(leader).http, "/readyz").is_ok_and(|(code, _)| code == 503),
    )
    .await;
    c.wait_until(
        Duration::from_secs(30),
        "the lone replica to report no leader",
        |c| c.metric(leader, "coord_has_leader") == 0.0,
    )
    .await;
}

/// `/metrics` of a live ensemble follows Prometheus' conventions: counters end in `_total`,
/// every metric has one HELP and one TYPE line, status codes carry gRPC's names, and the
/// metrics every exporter is expected to have are there (`coord_has_leader`,
/// `coord_build_info`, `process_*`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_prometheus_conventions() {
    const GRPC_CODES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    let (c, leader, client) = started(ClusterOptions::default()).await;
    client.insert("m/1", "v", false).await.expect("insert");
    // A refused call, so that a code other than OK is counted.
    let refused = client.insert("m/1", "w", false).await;
    assert!(refused.is_err(), "a second insert of one key was accepted");
    let (_, body) = http::get(c.replica(leader).http, "/metrics").expect("GET /metrics");
    let mut helps = std::collections::HashMap::<&str, usize>::new();
    let mut types = std::collections::HashMap::<&str, usize>::new();
    for line in body.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["#", "HELP", name, ..] => *helps.entry(name).or_default() += 1,
            ["#", "TYPE", name, kind] => {
                *types.entry(name).or_default() += 1;
                if *kind == "counter" {
                    assert!(
                        name.ends_with("_total"),
                        "counter {name} does not end in _total"
                    );
                }
            }
            _ => {}
        }
        if let Some((_, rest)) = line.split_once("code=\"") {
            let code = rest.split('"').next().unwrap_or_default();
            assert!(GRPC_CODES.contains(&code), "code {code:?} in {line}");
        }
    }
    for (name, n) in helps.iter().chain(types.iter()) {
        assert_eq!(*n, 1, "{name} has {n} HELP or TYPE lines");
    }
    assert!(body.contains("code=\"OK\""), "no OK calls counted");
    assert!(
        body.lines()
            .any(|l| l.contains("code=") && !l.contains("code=\"OK\"")),
        "the refused insert was not counted"
    );
    let version = env!("CARGO_PKG_VERSION");
    let info = body
        .lines()
        .find(|l| l.starts_with("coord_build_info{"))
        .expect("coord_build_info");
    assert!(
        info.starts_with(&format!(
            "coord_build_info{{version=\"{version}\",commit=\""
        )) && info.ends_with("\"} 1")
            && !info.contains("commit=\"\""),
        "{info}"
    );
    for id in c.ids() {
        assert_eq!(c.metric(id, "coord_has_leader"), 1.0, "replica {id}");
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(c.metric(id, name) > 0.0, "{name} of replica {id}");
        }
        // CPU time counts in clock ticks (10 ms): a quiet follower may not have used one yet.
        assert!(c.metric(id, "process_cpu_seconds_total") >= 0.0);
    }
    // The leader's CPU time grows with the work it does.
    let before = c.metric(leader, "process_cpu_seconds_total");
    for i in 0..300 {
        client
            .insert(&format!("m/cpu/{i}"), "v", false)
            .await
            .expect("insert");
    }
    let after = c.metric(leader, "process_cpu_seconds_total");
    assert!(
        after > before,
        "the leader's CPU time went from {before} to {after} over 300 writes"
    );
}

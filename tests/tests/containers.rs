//! `deploy/compose.yaml` in real containers (the image built offline from this build's binaries):
//! write through the ensemble while its leader container is killed, a replica is cut off the
//! network and reconnected, all three are restarted one by one, a fourth replica joins and an
//! original one is removed. At the end every acknowledged write is there and every replica's
//! `/status` agrees. Skips, saying why, where no Docker engine answers.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_tests::certs::TestPki;
use coord_tests::cluster::StatusView;
use coord_tests::compose::{self, Compose};
use coord_tests::http;
use tokio::time::Instant;

fn status(c: &Compose, id: u64) -> Option<StatusView> {
    let (code, body) = http::get(c.http(id), "/status").ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

fn ready(c: &Compose, id: u64) -> bool {
    http::get(c.http(id), "/readyz").is_ok_and(|(code, _)| code == 200)
}

async fn wait(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every replica of `ids` is ready.
async fn all_ready(c: &Compose, ids: &[u64]) {
    for &id in ids {
        wait(
            &format!("replica {id} ready"),
            Duration::from_secs(120),
            || ready(c, id),
        )
        .await;
    }
}

/// The leader that every replica of `ids` reports, once they agree.
async fn agreed_leader(c: &Compose, ids: &[u64]) -> u64 {
    let mut leader = 0;
    wait(
        "the replicas to agree on a leader",
        Duration::from_secs(60),
        || {
            let seen: BTreeSet<Option<u64>> = ids
                .iter()
                .map(|&i| status(c, i).and_then(|s| s.leader_id))
                .collect();
            match seen.into_iter().collect::<Vec<_>>().as_slice() {
                [Some(l)] if ids.contains(l) => {
                    leader = *l;
                    true
                }
                _ => false,
            }
        },
    )
    .await;
    leader
}

/// `docker kill`s the leader's container among `ids`; once the others agree on a new leader,
/// runs `meanwhile`; then starts the container again and waits until it is ready.
async fn kill_the_leader(
    c: &Compose,
    ids: &[u64],
    meanwhile: impl std::future::Future<Output = ()>,
) {
    let leader = agreed_leader(c, ids).await;
    eprintln!("docker kill {}", c.container(leader));
    c.docker_ok(&["kill", &c.container(leader)]);
    let rest: Vec<u64> = ids.iter().copied().filter(|&i| i != leader).collect();
    let new_leader = agreed_leader(c, &rest).await;
    assert_ne!(new_leader, leader);
    meanwhile.await;
    c.docker_ok(&["start", &c.container(leader)]);
    wait(
        "the killed replica ready again",
        Duration::from_secs(120),
        || ready(c, leader),
    )
    .await;
}

/// Waits until the writer has had `n` more writes acknowledged.
async fn writes_go_on(count: &AtomicUsize, n: usize) {
    let target = count.load(Ordering::Relaxed) + n;
    wait(
        &format!("{n} more acknowledged writes"),
        Duration::from_secs(90),
        || count.load(Ordering::Relaxed) >= target,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_ensemble_survives_kills_partitions_restarts_and_membership_changes() {
    if let Some(why) = compose::unavailable() {
        eprintln!("SKIPPED compose_ensemble_survives_kills_partitions_restarts_and_membership_changes: {why}");
        return;
    }
    let c = Compose::up();
    let originals = [1, 2, 3];
    all_ready(&c, &originals).await;
    let endpoints: Vec<String> = (1..=4).map(|i| c.grpc(i)).collect();
    let client = CoordClient::new(ClientOptions::new(endpoints.clone())).expect("client");

    // Load: unique keys, acknowledged ones remembered.
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (c, stop, count) = (client.clone(), stop.clone(), count.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("w/{n}");
                n += 1;
                if c.insert(&key, key.clone().into_bytes(), false)
                    .await
                    .is_ok()
                {
                    acked.push(key);
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
            acked
        })
    };
    writes_go_on(&count, 20).await;

    // 1. docker kill the leader's container; a new leader takes over; it comes back.
    kill_the_leader(&c, &originals, writes_go_on(&count, 20)).await;

    // 2. Cut the (new) leader off the network; the others go on; reconnect it.
    let cut = agreed_leader(&c, &originals).await;
    eprintln!("docker network disconnect {}", c.container(cut));
    c.docker_ok(&["network", "disconnect", &c.network(), &c.container(cut)]);
    let rest: Vec<u64> = originals.into_iter().filter(|&i| i != cut).collect();
    agreed_leader(&c, &rest).await;
    writes_go_on(&count, 20).await;
    c.docker_ok(&[
        "network",
        "connect",
        "--alias",
        &format!("coord{cut}"),
        &c.network(),
        &c.container(cut),
    ]);
    wait(
        "the partitioned replica ready again",
        Duration::from_secs(120),
        || ready(&c, cut),
    )
    .await;

    // 3. Rolling restart under load.
    for id in originals {
        eprintln!("docker restart {}", c.container(id));
        c.docker_ok(&["restart", "-t", "10", &c.container(id)]);
        wait(
            &format!("replica {id} ready after its restart"),
            Duration::from_secs(120),
            || ready(&c, id),
        )
        .await;
        writes_go_on(&count, 10).await;
    }

    // 4. A fourth replica joins; replica 1 leaves.
    c.compose_ok(&["up", "-d", "coord4"]);
    wait("replica 4 serving", Duration::from_secs(60), || {
        status(&c, 4).is_some()
    })
    .await;
    let members = client
        .add_member(4, "coord4:7101")
        .await
        .expect("add replica 4");
    assert!(members.iter().any(|m| m.id == 4 && m.voter), "{members:?}");
    writes_go_on(&count, 20).await;
    let members = client.remove_member(1).await.expect("remove replica 1");
    assert!(!members.iter().any(|m| m.id == 1), "{members:?}");
    c.compose_ok(&["stop", "-t", "5", "coord1"]);
    writes_go_on(&count, 20).await;

    stop.store(true, Ordering::Relaxed);
    let acked = writer.await.expect("writer");
    eprintln!("{} writes acknowledged", acked.len());

    // Every acknowledged write is there; every remaining replica reports the same state.
    let remaining = [2, 3, 4];
    let leader = agreed_leader(&c, &remaining).await;
    let last = status(&c, leader).expect("leader status").last_applied;
    wait(
        "the replicas to agree on the applied state",
        Duration::from_secs(60),
        || {
            remaining.iter().all(|&i| {
                status(&c, i).is_some_and(|s| s.leader_id == Some(leader) && s.last_applied >= last)
            })
        },
    )
    .await;
    let reader = CoordClient::new(ClientOptions::new(vec![c.grpc(4)])).expect("client");
    for k in &acked {
        let v = reader.try_get(k).await.expect("read");
        assert_eq!(v.as_deref(), Some(k.as_bytes()), "acknowledged write {k}");
    }
    for i in remaining {
        let s = status(&c, i).expect("status");
        assert_eq!(s.leader_id, Some(leader), "replica {i}: {s:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_ensemble_over_tls_requires_certificates_and_survives_a_leader_kill() {
    if let Some(why) = compose::unavailable() {
        eprintln!("SKIPPED compose_ensemble_over_tls_requires_certificates_and_survives_a_leader_kill: {why}");
        return;
    }
    // Replicas' certificates name the host their peers reach them by and the one the test uses.
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = TestPki::new(dir.path(), "coord", &[]);
    for id in 1..=4 {
        pki.issue_for(
            &pki.replica(id),
            &[format!("coord{id}"), "127.0.0.1".into()],
        );
    }
    let ops = pki.client_identity("ops");
    let operator_tls = pki.client(Some(&ops));
    // The replicas run as uid 10001 and read their keys from the mount.
    let readable = |path: &std::path::Path, mode| {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    };
    readable(dir.path(), 0o755);
    for entry in std::fs::read_dir(dir.path()).expect("certs") {
        readable(&entry.expect("entry").path(), 0o644);
    }
    let certs = dir.path().display().to_string();
    let c = Compose::up_with(
        &["compose.tls.yaml"],
        &[
            ("COORD_CERTS", &certs),
            ("COORD_TLS_CLIENT_AUTH", "require"),
        ],
    );
    let originals = [1, 2, 3];
    all_ready(&c, &originals).await;
    let endpoints: Vec<String> = originals.iter().map(|&i| c.grpc(i)).collect();
    let mut options = ClientOptions::new(endpoints.clone());
    options.tls = Some(operator_tls);
    let client = CoordClient::new(options).expect("client");
    for i in 0..20 {
        client
            .insert(&format!("before/{i}"), "v", false)
            .await
            .expect("insert over TLS");
    }
    // Without a certificate nothing gets through.
    let mut anonymous = ClientOptions::new(endpoints);
    anonymous.tls = Some(pki.client(None));
    anonymous.unavailable_after = Duration::from_secs(2);
    let err = CoordClient::new(anonymous)
        .expect("client")
        .insert("anonymous", "v", false)
        .await
        .expect_err("a client without a certificate was served");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    let logs = c.logs();
    assert!(
        logs.contains("TLS handshake refused") && logs.contains("no certificates"),
        "no replica logged the refused handshake:\n{logs}"
    );
    // The leader's container dies; its peers elect a new leader over TLS; it comes back.
    let writes = async {
        for i in 0..20 {
            client
                .insert(&format!("after/{i}"), "v", false)
                .await
                .expect("insert after the leader's death");
        }
    };
    kill_the_leader(&c, &originals, writes).await;
    assert_eq!(client.get_dir("before").await.expect("read").len(), 20);
    assert_eq!(client.get_dir("after").await.expect("read").len(), 20);
    assert_eq!(client.try_get("anonymous").await.expect("read"), None);
}

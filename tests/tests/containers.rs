//! coord's images and `deploy/compose.yaml` in real containers (the images built offline from
//! this workspace's release binaries):
//! - Both images (the replica's and the `coord-proxy` sidecar's) stay within their size bounds and
//!   hold their own binaries only, without debug info but with their symbol tables, and with the
//!   build ids of the build's own binaries (their symbols for a crash report).
//! - Write through the ensemble while its leader container is killed, a replica is cut off the
//!   network and reconnected, all three are restarted one by one, a fourth replica joins and an
//!   original one is removed. At the end every acknowledged write is there and every replica's
//!   `/status` agrees.
//! - Over TLS, the sidecar's image runs as the training Job runs it (the task's certificate, the
//!   Job's variables and startup probe) and a call through it reaches the ensemble; the replicas
//!   report the commit they were built from.
//!
//! Skips, saying why, where no Docker engine answers.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_tests::certs::TestPki;
use coord_tests::cluster::{free_ports, StatusView};
use coord_tests::compose::{self, Compose, Image};
use coord_tests::http;
use tokio::time::Instant;

/// Megabytes as `docker image ls` counts them.
const MB: u64 = 1_000_000;

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

/// `readelf ARGS FILE`'s report.
fn readelf(args: &[&str], file: &Path) -> String {
    let out = Command::new("readelf")
        .args(args)
        .arg(file)
        .output()
        .expect("run readelf (binutils, which deploy/image-rootfs.sh needs for objcopy)");
    assert!(out.status.success(), "readelf {args:?} {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn build_id(file: &Path) -> String {
    readelf(&["-n"], file)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .unwrap_or_else(|| panic!("{} has no build id", file.display()))
}

/// `coordinator --version` of the release build the images hold: `coordinator 0.1.0 (commit c)`.
fn built_version() -> String {
    let out = Command::new(compose::release_binaries().join("coordinator"))
        .arg("--version")
        .output()
        .expect("run coordinator --version");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The command of the startup probe of the training Job's coord-proxy sidecar
/// (deploy/k8s/tls/training-job.yaml), which the kubelet runs in the sidecar's container.
fn job_startup_probe() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s/tls/training-job.yaml");
    let text = std::fs::read_to_string(&path).expect("training Job");
    let job: serde_yaml::Value = serde_yaml::from_str(&text).expect("training Job YAML");
    let sidecar = job["spec"]["template"]["spec"]["initContainers"]
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|c| c["name"].as_str() == Some("coord-proxy"))
        .expect("the training Job's coord-proxy init container");
    sidecar["startupProbe"]["exec"]["command"]
        .as_sequence()
        .expect("the sidecar's startupProbe.exec.command")
        .iter()
        .map(|w| w.as_str().expect("a probe word").to_string())
        .collect()
}

#[test]
fn images_hold_their_own_binaries_without_debug_info_within_their_size_bounds() {
    if let Some(why) = compose::unavailable() {
        eprintln!("SKIPPED images_hold_their_own_binaries_without_debug_info_within_their_size_bounds: {why}");
        return;
    }
    let built = compose::release_binaries();
    let coordinator = Image::build("coordinator");
    let proxy = Image::build("coord-proxy");
    for (image, bound, programs) in [
        (&coordinator, 60 * MB, &["coordctl", "coordinator"][..]),
        (&proxy, 25 * MB, &["coord-proxy"][..]),
    ] {
        let size = image.size();
        eprintln!("{}: {:.1} MB", image.name, size as f64 / MB as f64);
        assert!(
            size <= bound,
            "{} is {size} bytes, over its bound of {bound}",
            image.name
        );
        let dir = tempfile::tempdir().expect("temp dir");
        image.copy_out("/usr/local/bin", dir.path());
        let mut held: Vec<String> = std::fs::read_dir(dir.path().join("bin"))
            .expect("the image's /usr/local/bin")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        held.sort();
        assert_eq!(held, programs, "{}: /usr/local/bin", image.name);
        for program in programs {
            let shipped = dir.path().join("bin").join(program);
            let sections = readelf(&["-S", "-W"], &shipped);
            assert!(
                !sections.contains(".debug_info"),
                "{}: {program} ships with its debug info",
                image.name
            );
            // Without it a panic's backtrace names no function.
            assert!(
                sections.contains(".symtab"),
                "{}: {program} lost its symbol table",
                image.name
            );
            assert_eq!(
                build_id(&shipped),
                build_id(&built.join(program)),
                "{}: {program} is not the build's binary stripped, so the build's is not its symbol file",
                image.name
            );
        }
    }
    // The commit the binary was built from survives the stripping.
    let version = built_version();
    assert!(version.contains("(commit "), "{version:?}");
    let out = Command::new("docker")
        .args(["run", "--rm", &coordinator.name, "--version"])
        .output()
        .expect("docker run");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), version);
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
    // The commit the replicas were built from, in coord_build_info.
    let version = built_version();
    let (_, commit) = version
        .trim_end_matches(')')
        .split_once("(commit ")
        .expect("coordinator --version names the commit");
    let (_, metrics) = http::get(c.http(1), "/metrics").expect("/metrics");
    assert!(
        metrics.contains(&format!("commit=\"{commit}\"}} 1")),
        "coord_build_info does not report commit {commit}:\n{metrics}"
    );
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

    // The sidecar's image, run as the training Job runs it: the task's certificate and the Job's
    // variables. It listens on all interfaces here, for the test to reach it through a published
    // port; the Job keeps it on localhost.
    let proxy_image = Image::build("coord-proxy");
    let task = pki.issue(&pki.task("worker", 0));
    readable(&task.cert, 0o644);
    readable(&task.key, 0o644);
    let in_certs = |p: &Path| {
        let file = p.file_name().expect("file name").to_string_lossy();
        format!("/certs/{file}")
    };
    let port = free_ports(1)[0];
    let env = [
        "COORD_ENDPOINTS=coord1:7101,coord2:7101,coord3:7101".to_string(),
        format!("COORD_TLS_CA={}", in_certs(&pki.ca_path())),
        format!("COORD_TLS_CERT={}", in_certs(&task.cert)),
        format!("COORD_TLS_KEY={}", in_certs(&task.key)),
    ];
    let published = format!("127.0.0.1:{port}:7200");
    let mount = format!("{certs}:/certs:ro");
    let mut options = vec!["-p", &published, "-v", &mount];
    for e in &env {
        options.extend(["-e", e]);
    }
    let sidecar = c.run(&options, &proxy_image, &["--listen", "0.0.0.0:7200"]);
    // The Job's startup probe passes in the image once the proxy listens.
    let probe = job_startup_probe();
    wait(
        "the training Job's startup probe to pass in the sidecar",
        Duration::from_secs(60),
        || sidecar.exec_ok(&probe),
    )
    .await;
    // A call through the sidecar reaches the ensemble, as task worker/0.
    let mut through = CoordinationServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect to the sidecar");
    through
        .insert_key_value(tf::InsertKeyValueRequest {
            kv: Some(tf::KeyValueEntry {
                key: "sidecar/worker-0".into(),
                value: Bytes::from("through coord-proxy"),
            }),
            allow_overwrite: false,
        })
        .await
        .expect("an insert through the sidecar");
    drop(through);
    assert_eq!(
        client
            .try_get("sidecar/worker-0")
            .await
            .expect("read")
            .as_deref(),
        Some(&b"through coord-proxy"[..])
    );
    // `docker stop` (and Kubernetes ending the sidecar) stops it at once: STOPSIGNAL SIGINT.
    let stopping = Instant::now();
    c.docker_ok(&["stop", "-t", "30", &sidecar.name]);
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "the sidecar took {:?} to stop",
        stopping.elapsed()
    );
    assert_eq!(
        sidecar.inspect("{{.State.ExitCode}}"),
        "0",
        "{}",
        sidecar.logs()
    );
}

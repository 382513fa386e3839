//! A replica refuses to start on a data directory that is not its own, with flags that disagree
//! with what it was created with, or on damaged data — with a clear message and a non-zero exit,
//! never a panic — while the rest of the ensemble keeps serving.

use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_tests::{Cluster, ClusterOptions};

const TIMEOUT: Duration = Duration::from_secs(30);

fn replace_flag(args: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = args.to_vec();
    if let Some(i) = out.iter().position(|a| a == flag) {
        out[i + 1] = value.to_string();
    } else {
        out.extend([flag.to_string(), value.to_string()]);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_a_foreign_data_dir_or_changed_flags() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let client = CoordClient::new(ClientOptions::new(c.endpoints())).expect("client");
    client.insert("before", "1", false).await.expect("insert");
    c.kill(2);

    let args = c.args_of(2);
    c.expect_refusal(
        2,
        &replace_flag(&args, "--id", "1"),
        "belongs to replica 2, not to replica 1",
        TIMEOUT,
    );
    let other_members = c
        .initial_cluster()
        .replace(&c.replica(3).grpc.to_string(), "127.0.0.1:1");
    c.expect_refusal(
        2,
        &replace_flag(&args, "--initial-cluster", &other_members),
        "disagrees with the membership this replica was created with",
        TIMEOUT,
    );
    c.expect_refusal(
        2,
        &replace_flag(&args, "--cluster-token", "someone-else"),
        "another ensemble",
        TIMEOUT,
    );
    c.expect_refusal(
        2,
        &replace_flag(&args, "--id", "9"),
        "--id 9 is not one of the replicas",
        TIMEOUT,
    );

    // None of that touched replica 2's data: with its own flags it rejoins and catches up.
    client
        .insert("while-away", "2", false)
        .await
        .expect("insert with 2 of 3");
    c.spawn(2);
    let leader = c.wait_for_leader(TIMEOUT).await;
    let target = c.status(leader).expect("status").last_log_index;
    c.wait_applied(2, target, TIMEOUT).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_data_is_refused_and_the_others_keep_serving() {
    let mut c = Cluster::start(ClusterOptions {
        // Snapshot early so there is a snapshot file to damage.
        extra_args: vec!["--snapshot-every-entries".into(), "20".into()],
        ..ClusterOptions::default()
    });
    c.wait_for_leader(TIMEOUT).await;
    let client = CoordClient::new(ClientOptions::new(c.endpoints())).expect("client");
    for i in 0..60 {
        client
            .insert(&format!("k/{i}"), "v", false)
            .await
            .expect("insert");
    }
    let snap = c.replica(3).data_dir.join("snapshots/snapshot.bin");
    c.wait_until(TIMEOUT, "replica 3 to write a snapshot", |_| snap.exists())
        .await;

    // A truncated snapshot.
    c.kill(3);
    let bytes = std::fs::read(&snap).expect("read snapshot");
    std::fs::write(&snap, &bytes[..bytes.len() / 2]).expect("truncate snapshot");
    let args = c.args_of(3);
    c.expect_refusal(3, &args, "is corrupt", TIMEOUT);
    client
        .insert("still", "serving", false)
        .await
        .expect("two replicas still serve");
    std::fs::write(&snap, &bytes).expect("restore snapshot");

    // The log's segment files overwritten with garbage: the newest alone would read as a torn
    // write at byte 0, an empty log, and the replica would forget its vote; the witness catches it.
    c.kill(2);
    let raft_dir = c.replica(2).data_dir.join("raft");
    let mut scribbled = 0;
    for entry in std::fs::read_dir(&raft_dir).expect("raft dir") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "seg") {
            let len = std::fs::metadata(&path).expect("segment").len() as usize;
            std::fs::write(&path, vec![0xA5u8; len.max(4096)]).expect("scribble over the log");
            scribbled += 1;
        }
    }
    assert!(scribbled > 0, "no log segment in {}", raft_dir.display());
    let args = c.args_of(2);
    c.expect_refusal(2, &args, "is damaged", TIMEOUT);

    // The whole Raft directory deleted, the identity left behind.
    std::fs::remove_dir_all(&raft_dir).expect("remove raft dir");
    c.expect_refusal(2, &args, "Raft state (raft/) is gone", TIMEOUT);

    // A data dir that is a file.
    let file = c.root().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write file");
    let args = replace_flag(&c.args_of(2), "--data-dir", &file.display().to_string());
    c.expect_refusal(2, &args, "cannot create data directory", TIMEOUT);

    // Replica 3 with its snapshot restored rejoins; the ensemble has everything.
    c.spawn(3);
    c.wait_for_leader(TIMEOUT).await;
    assert_eq!(
        client.try_get("still").await.expect("read"),
        Some(Bytes::from("serving"))
    );
    assert_eq!(client.get_dir("k").await.expect("dir").len(), 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_replica_even_with_clients_connected() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(TIMEOUT).await;
    // A client holds a connection to the leader with a call parked on it.
    let parked = {
        let cl = CoordClient::new(ClientOptions::new(vec![c.replica(leader).grpc.to_string()]))
            .expect("client");
        tokio::spawn(async move { cl.get("never/written").await })
    };
    c.wait_until(TIMEOUT, "the get to park", |c| {
        coord_tests::http::get(c.replica(leader).http, "/metrics")
            .is_ok_and(|(_, m)| m.lines().any(|l| l == "coord_parked_calls 1"))
    })
    .await;
    let code = c.terminate(leader, Duration::from_secs(15));
    assert_eq!(
        code,
        Some(0),
        "SIGTERM did not stop the replica by itself within 15 s"
    );
    parked.abort();
    // The other two carry on.
    c.wait_for_leader(TIMEOUT).await;
}

/// A replica that missed more than the log the leader keeps catches up by a snapshot install, and
/// its log shows the transfer as it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_catches_up_by_snapshot_and_logs_it() {
    let mut c = Cluster::start(ClusterOptions {
        extra_args: vec!["--snapshot-every-entries".into(), "100".into()],
        ..ClusterOptions::default()
    });
    let leader = c.wait_for_leader(TIMEOUT).await;
    let lagging = c.other_than(leader);
    c.kill(lagging);
    let client = CoordClient::new(ClientOptions::new(c.endpoints())).expect("client");
    // More entries than the leader keeps after a snapshot (1,000), with enough data for a
    // multi-chunk snapshot.
    let value = Bytes::from(vec![b'x'; 16 << 10]);
    for i in 0..1_300 {
        client
            .insert(&format!("big/{i}"), value.clone(), false)
            .await
            .expect("insert");
    }
    c.spawn(lagging);
    let leader = c.wait_for_leader(TIMEOUT).await;
    let target = c.status(leader).expect("status").last_log_index;
    c.wait_applied(lagging, target, TIMEOUT).await;
    let log = c.log(lagging);
    for line in [
        "receiving a snapshot from the leader",
        "snapshot received; installing it",
        "snapshot installed",
    ] {
        assert!(
            log.contains(line),
            "{line:?} missing from replica {lagging}'s log:\n{log}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_in_an_older_log_segment_is_refused() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let client = CoordClient::new(ClientOptions::new(c.endpoints())).expect("client");
    // About 6 MB of log: more than one 4 MiB segment on every replica.
    let value = Bytes::from(vec![b'x'; 16 << 10]);
    for i in 0..400 {
        client
            .insert(&format!("big/{i}"), value.clone(), false)
            .await
            .expect("insert");
    }
    let leader = c.wait_for_leader(TIMEOUT).await;
    let victim = c.other_than(leader);
    let target = c.status(leader).expect("status").last_log_index;
    c.wait_applied(victim, target, TIMEOUT).await;
    c.kill(victim);
    let raft_dir = c.replica(victim).data_dir.join("raft");
    let mut segments: Vec<_> = std::fs::read_dir(&raft_dir)
        .expect("raft dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 2, "only {} segment(s)", segments.len());
    let oldest = &segments[0];
    let mut bytes = std::fs::read(oldest).expect("segment");
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x10;
    std::fs::write(oldest, &bytes).expect("damage a record");
    let args = c.args_of(victim);
    let name = oldest
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_string();
    c.expect_refusal(victim, &args, &name, TIMEOUT);
    c.expect_refusal(victim, &args, "is damaged", TIMEOUT);
    client
        .insert("still", "serving", false)
        .await
        .expect("the other two still serve");
}

/// A second `coordinator` on a running replica's data directory exits non-zero at once, naming
/// the process that holds it, and changes nothing: the replica keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_a_data_dir_is_refused_naming_the_holder() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let holder = c.pid(2).expect("replica 2 runs");
    let bin = coord_tools::process::workspace_binary("coordinator", Some("COORD_BIN"));
    let mut second = std::process::Command::new(bin)
        .args(c.args_of(2))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a second coordinator");
    let deadline = std::time::Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(s) = second.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = second.kill();
            panic!("the second coordinator on replica 2's data directory did not exit");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(second.stderr.as_mut().expect("piped stderr"), &mut stderr)
        .expect("read stderr");
    assert!(
        !status.success(),
        "it must exit non-zero; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("is in use by another coordinator")
            && stderr.contains(&format!("pid {holder}")),
        "the refusal names the holder (pid {holder}); stderr:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Replica 2 still serves.
    let client =
        CoordClient::new(ClientOptions::new(vec![c.replica(2).grpc.to_string()])).expect("client");
    client.insert("after", "1", false).await.expect("insert");
    assert!(c.is_running(2));
}

/// `--version` names the commit the binary was built from, and `--help` the environment
/// variable of every flag.
#[test]
fn version_names_the_commit_and_help_the_environment_variables() {
    let bin = coord_tools::process::coordinator_binary();
    let out = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .expect("coordinator --version");
    let version = String::from_utf8_lossy(&out.stdout);
    let expected = format!("coordinator {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(version.starts_with(&expected), "{version}");
    let commit = version
        .trim()
        .trim_start_matches(&expected)
        .trim_end_matches(')');
    assert!(
        commit == "unknown" || (commit.len() >= 7 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{version}"
    );
    let out = std::process::Command::new(&bin)
        .arg("--help")
        .output()
        .expect("coordinator --help");
    let help = String::from_utf8_lossy(&out.stdout);
    for env in [
        "[env: COORD_QUOTA_BYTES=]",
        "[env: COORD_DATA_DIR=]",
        "[env: COORD_JOB=]",
    ] {
        assert!(help.contains(env), "{env} not in --help:\n{help}");
    }
}

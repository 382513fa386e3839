//! Backup and restore: `coordctl snapshot save FILE` taken under write load, and a new ensemble
//! started from it with `coordinator --restore FILE`: every write acknowledged before the backup
//! began is in the new ensemble, none begun after it ended, and the new ensemble has an identity
//! of its own. A damaged backup or a used data directory is refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_tests::cli::coordctl_json;
use coord_tests::cluster::{Cluster, ClusterOptions};

const TIMEOUT: Duration = Duration::from_secs(60);

fn client(c: &Cluster) -> CoordClient {
    CoordClient::new(ClientOptions::new(c.endpoints())).expect("client")
}

fn identity(c: &Cluster, id: u64) -> serde_json::Value {
    let path = c.replica(id).data_dir.join("identity.json");
    serde_json::from_slice(&std::fs::read(&path).expect("identity.json")).expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_into_a_new_ensemble() {
    let mut old = Cluster::start(ClusterOptions::default());
    old.wait_for_leader(TIMEOUT).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("backup.bin");

    // A writer acknowledging keys in order, all through the backup.
    let acked: Arc<Mutex<Vec<u64>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (cl, acked, stop) = (client(&old), acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                cl.insert(&format!("w/{i}"), format!("v{i}"), false)
                    .await
                    .expect("write");
                acked.lock().expect("lock").push(i);
                i += 1;
            }
        })
    };
    let cl = client(&old);
    cl.increment("counter", 42).await.expect("increment");
    old.wait_until(TIMEOUT, "300 writes acknowledged", |_| {
        acked.lock().expect("lock").len() >= 300
    })
    .await;

    let acked_before = acked.lock().expect("lock").len() as u64;
    let eps = old.endpoints();
    let path = file.display().to_string();
    let saved =
        tokio::task::spawn_blocking(move || coordctl_json(&eps, &["snapshot", "save", &path]))
            .await
            .expect("join");
    let begun_after = acked.lock().expect("lock").last().map_or(0, |l| l + 1) + 1;
    // A few more after the backup; none of them may be in it.
    old.wait_until(TIMEOUT, "writes after the backup", |_| {
        acked.lock().expect("lock").len() as u64 >= begun_after + 20
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    let row = &saved[0];
    println!("backup: {row}");
    assert_eq!(
        row["bytes"].as_u64(),
        std::fs::metadata(&file).ok().map(|m| m.len()),
        "{row}"
    );
    assert!(row["keys"].as_u64().unwrap_or(0) > acked_before, "{row}");
    let old_cluster_id = identity(&old, 1)["cluster_id"].clone();

    // The old ensemble goes; a new one starts from the backup (same token, new addresses).
    drop(old);
    let mut new = Cluster::start(ClusterOptions {
        extra_args: vec!["--restore".into(), file.display().to_string()],
        ..ClusterOptions::default()
    });
    new.wait_for_leader(TIMEOUT).await;
    let ncl = client(&new);
    let restored: std::collections::HashMap<String, Bytes> =
        ncl.get_dir("w").await.expect("list").into_iter().collect();
    for i in 0..acked_before {
        assert_eq!(
            restored.get(&format!("w/{i}")),
            Some(&Bytes::from(format!("v{i}"))),
            "w/{i} was acknowledged before the backup began"
        );
    }
    for i in begun_after..begun_after + 20 {
        assert!(
            !restored.contains_key(&format!("w/{i}")),
            "w/{i} was written after the backup ended"
        );
    }
    println!(
        "{} keys restored; {acked_before} acknowledged before the backup began, all present",
        restored.len()
    );
    assert_eq!(ncl.increment("counter", 1).await.expect("increment"), 43);
    ncl.insert("new/ensemble", "works", false)
        .await
        .expect("write");

    // An identity of its own, recorded with the backup it came from.
    let ident = identity(&new, 2);
    assert_eq!(
        ident["restored_from"].as_u64().map(|b| format!("{b:016x}")),
        row["backup_id"].as_str().map(str::to_string),
        "{ident}"
    );
    assert_ne!(ident["cluster_id"], old_cluster_id);

    // A replica restarted without --restore keeps its restored identity and state.
    let leader = new.wait_for_leader(TIMEOUT).await;
    let follower = new.other_than(leader);
    new.kill(follower);
    let args: Vec<String> = new
        .args_of(follower)
        .into_iter()
        .filter(|a| a != "--restore" && *a != file.display().to_string())
        .collect();
    new.spawn_with(follower, &args);
    new.wait_until(TIMEOUT, "the restarted replica caught up", |c| {
        c.status(follower).is_some_and(|s| s.leader_id.is_some())
    })
    .await;
    ncl.insert("after/restart", "ok", false)
        .await
        .expect("write");

    // Refusals: a damaged backup, and --restore on a data directory in use by an ensemble.
    let mut damaged = std::fs::read(&file).expect("read");
    let mid = damaged.len() / 2;
    damaged[mid] ^= 0x40;
    let bad = dir.path().join("damaged.bin");
    std::fs::write(&bad, &damaged).expect("write");
    new.kill(follower);
    let mut with_bad = args.clone();
    with_bad.extend(["--restore".to_string(), bad.display().to_string()]);
    new.expect_refusal(follower, &with_bad, "checksum mismatch", TIMEOUT);
    let mut fresh = Cluster::start(ClusterOptions::default());
    fresh.wait_for_leader(TIMEOUT).await;
    fresh.kill(3);
    let mut reuse = fresh.args_of(3);
    reuse.extend(["--restore".to_string(), file.display().to_string()]);
    fresh.expect_refusal(3, &reuse, "already holds a replica", TIMEOUT);
}

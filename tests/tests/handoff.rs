//! Graceful leader handoff: `coordctl member transfer-leader`, and a rolling restart of the whole
//! ensemble (SIGTERM, one replica at a time, the leader last) under agent load with no failed
//! call.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use coord_agent::{ClientOptions, CoordClient};
use coord_tests::cli::{coordctl, coordctl_json};
use coord_tests::cluster::{Cluster, ClusterOptions};

const TIMEOUT: Duration = Duration::from_secs(60);

fn client(c: &Cluster) -> CoordClient {
    CoordClient::new(ClientOptions::new(c.endpoints())).expect("client")
}

/// What the load saw.
#[derive(Default)]
struct Seen {
    ok: u64,
    failed: Vec<String>,
    longest: Duration,
}

/// Agent clients writing and reading back their own keys until `stop`.
fn start_load(
    c: &Cluster,
    clients: usize,
    stop: &Arc<AtomicBool>,
) -> (Arc<Mutex<Seen>>, Vec<tokio::task::JoinHandle<()>>) {
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let tasks = (0..clients)
        .map(|w| {
            let (cl, seen, stop) = (client(c), seen.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("load/{w}/{i}");
                    let started = Instant::now();
                    let result = match cl.insert(&key, "v", false).await {
                        Ok(()) => cl.get(&key).await.map(|_| ()),
                        Err(e) => Err(e),
                    };
                    let took = started.elapsed();
                    let mut s = seen.lock().expect("lock");
                    match result {
                        Ok(()) => s.ok += 1,
                        Err(e) => s.failed.push(format!("{key}: {e:?}")),
                    }
                    s.longest = s.longest.max(took);
                    i += 1;
                }
            })
        })
        .collect();
    (seen, tasks)
}

/// Waits until replica `id` runs, follows a leader and has applied what the leader had.
async fn caught_up(c: &mut Cluster, id: u64) {
    let target = {
        let leader = c.wait_for_leader(TIMEOUT).await;
        c.status(leader).map_or(0, |s| s.last_log_index)
    };
    c.wait_until(TIMEOUT, "the restarted replica caught up", |c| {
        c.status(id)
            .is_some_and(|s| s.leader_id.is_some() && s.last_applied >= target)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_with_handoff_fails_no_call() {
    let mut c = Cluster::start(ClusterOptions::default());
    let first_leader = c.wait_for_leader(TIMEOUT).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (seen, load) = start_load(&c, 4, &stop);
    c.wait_until(TIMEOUT, "load running", |_| {
        seen.lock().expect("lock").ok >= 50
    })
    .await;

    let mut order: Vec<u64> = c.ids().into_iter().filter(|i| *i != first_leader).collect();
    order.push(first_leader);
    for id in order {
        let leader = c.wait_for_leader(TIMEOUT).await;
        let term = c.status(leader).map_or(0, |s| s.term);
        let exit = tokio::task::block_in_place(|| c.terminate(id, Duration::from_secs(20)));
        assert_eq!(
            exit,
            Some(0),
            "replica {id} did not stop by itself on SIGTERM"
        );
        if id == leader {
            assert!(
                c.log(id).contains("leadership handed over"),
                "the leader stopped without a handoff:\n{}",
                c.log(id)
            );
            let next = c.wait_for_leader(TIMEOUT).await;
            let next_term = c.status(next).map_or(0, |s| s.term);
            assert_eq!(next_term, term + 1, "one election, the handoff's");
        }
        c.spawn(id);
        caught_up(&mut c, id).await;
        let before = seen.lock().expect("lock").ok;
        c.wait_until(TIMEOUT, "load goes on", |_| {
            seen.lock().expect("lock").ok >= before + 20
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.expect("load task");
    }
    let s = seen.lock().expect("lock");
    println!(
        "rolling restart with handoff: {} calls, {} failed, longest {:?}",
        s.ok,
        s.failed.len(),
        s.longest
    );
    assert!(s.failed.is_empty(), "failed calls: {:?}", s.failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordctl_transfers_leadership_to_the_voter_named() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(TIMEOUT).await;
    let cl = client(&c);
    // A leader refuses to hand over within a lease of its election (see raft::handoff): let
    // some writes go by first.
    for i in 0..100 {
        cl.insert(&format!("k/{i}"), "v", false)
            .await
            .expect("write");
    }
    let term = c.status(leader).map_or(0, |s| s.term);
    let target = c.other_than(leader);
    let eps = c.endpoints();
    let id = target.to_string();
    let reply = tokio::task::spawn_blocking(move || {
        coordctl_json(&eps, &["member", "transfer-leader", &id])
    })
    .await
    .expect("join");
    println!("transfer-leader: {reply}");
    assert_eq!(reply[0]["leader"].as_u64(), Some(target), "{reply}");
    assert_eq!(c.wait_for_leader(TIMEOUT).await, target);
    assert_eq!(c.status(target).map_or(0, |s| s.term), term + 1);
    cl.insert("after", "v", false)
        .await
        .expect("write on the new leader");

    // A replica that is not a voter is refused, naming it.
    let eps = c.endpoints();
    let out =
        tokio::task::spawn_blocking(move || coordctl(&eps, &["member", "transfer-leader", "9"]))
            .await
            .expect("join");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("replica 9 is not a voter"), "{stderr}");
}

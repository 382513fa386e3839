//! The agent across leader kills: calls in flight complete with the answer they would have had,
//! no mutation applies twice, no watch event is lost or repeated; and when the whole ensemble is
//! gone for longer than the deadline, calls fail UNAVAILABLE until it is back.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coord_agent::{Agent, AgentConfig, ChangeKind, KeyChange};
use coord_tests::cluster::wait_for_count;
use coord_tests::coord_suite::{Env, LEADER_TIMEOUT};
use tonic::Code;

fn agent(env: &Env, id: i32, unavailable_after: Duration) -> Agent {
    let mut config = AgentConfig::new(env.cluster.endpoints(), "worker", id);
    config.heartbeat_interval = Duration::from_millis(300);
    config.heartbeat_timeout = Duration::from_secs(5);
    config.unavailable_after = unavailable_after;
    Agent::new(config, tracing_free_log).expect("agent")
}

fn tracing_free_log(e: &tonic::Status) {
    eprintln!("agent error callback: {e:?}");
}

async fn kill_leader(env: &mut Env) -> u64 {
    let old = env.cluster.wait_for_leader(LEADER_TIMEOUT).await;
    env.cluster.kill(old);
    let new = env.cluster.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(old, new);
    old
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_agents_at_a_barrier_through_a_leader_kill() {
    let mut env = Env::start(3, &["--job", "worker=8"]).await;
    let agents: Vec<Agent> = (0..8)
        .map(|i| agent(&env, i, Duration::from_secs(30)))
        .collect();
    for a in &agents {
        a.connect().await.expect("connect");
    }
    let waiting: Vec<_> = agents[..7]
        .iter()
        .map(|a| {
            let a = a.clone();
            tokio::spawn(async move {
                a.wait_at_barrier("epoch-end", Duration::from_secs(60), &[])
                    .await
            })
        })
        .collect();
    env.wait_parked(7).await;
    kill_leader(&mut env).await;
    agents[7]
        .wait_at_barrier("epoch-end", Duration::from_secs(60), &[])
        .await
        .expect("last arrival");
    for w in waiting {
        w.await.expect("join").expect("barrier passes for everyone");
    }
    // The next use of the same id works too (the agents agree on its counter).
    let again: Vec<_> = agents
        .iter()
        .map(|a| {
            let a = a.clone();
            tokio::spawn(async move {
                a.wait_at_barrier("epoch-end", Duration::from_secs(60), &[])
                    .await
            })
        })
        .collect();
    for w in again {
        w.await.expect("join").expect("second use");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_get_through_a_leader_kill() {
    let mut env = Env::start(3, &["--job", "worker=1"]).await;
    let a = agent(&env, 0, Duration::from_secs(30));
    let get = {
        let a = a.clone();
        tokio::spawn(async move { a.get_key_value("model/ready", None).await })
    };
    env.wait_parked(1).await;
    kill_leader(&mut env).await;
    assert!(!get.is_finished(), "the get must not fail over the kill");
    let writer = agent(&env, 0, Duration::from_secs(30));
    writer
        .insert_key_value("model/ready", "step-1000")
        .await
        .expect("insert");
    let got = tokio::time::timeout(Duration::from_secs(20), get)
        .await
        .expect("the get completes")
        .expect("join")
        .expect("get");
    assert_eq!(got, Bytes::from("step-1000"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inserts_and_increments_apply_once_through_a_leader_kill() {
    let mut env = Env::start(3, &["--job", "worker=4"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|i| {
            let (a, stop, done) = (
                agent(&env, i, Duration::from_secs(30)),
                stop.clone(),
                done.clone(),
            );
            tokio::spawn(async move {
                let mut increments = 0u64;
                let mut inserted = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    // Insert-if-absent of a fresh key: a retry applied twice would say ALREADY_EXISTS.
                    let key = format!("once/{i}/{n}");
                    a.insert_key_value(&key, format!("{n}"))
                        .await
                        .unwrap_or_else(|e| panic!("insert {key}: {e:?}"));
                    inserted.push(key);
                    a.increment_key_value("total", 1).await.expect("increment");
                    increments += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
                (increments, inserted)
            })
        })
        .collect();
    let wait_for = |n: u64| wait_for_count(&done, n, Duration::from_secs(60));
    wait_for(100).await;
    kill_leader(&mut env).await;
    let after_kill = done.load(Ordering::Relaxed);
    wait_for(after_kill + 100).await;
    stop.store(true, Ordering::Relaxed);
    let mut increments = 0;
    let mut inserted = BTreeSet::new();
    for w in workers {
        let (i, keys) = w.await.expect("worker");
        increments += i;
        inserted.extend(keys);
    }
    let check = agent(&env, 0, Duration::from_secs(30));
    let total = check
        .try_get_key_value("total")
        .await
        .expect("read")
        .expect("total exists");
    assert_eq!(
        total,
        Bytes::from(increments.to_string()),
        "increments applied more or less than once"
    );
    let stored: BTreeSet<String> = check
        .get_key_value_dir("once")
        .await
        .expect("dir")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(
        stored, inserted,
        "inserted keys differ from the acknowledged ones"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_loses_and_repeats_nothing_through_a_leader_kill() {
    let mut env = Env::start(3, &["--job", "worker=1"]).await;
    let watcher = agent(&env, 0, Duration::from_secs(30));
    let seen: Arc<Mutex<Vec<KeyChange>>> = Arc::default();
    let s = seen.clone();
    watcher
        .start_watch_key("w", move |r| {
            s.lock().expect("lock").extend(r.expect("watch ended"))
        })
        .expect("watch");
    env.wait_watches(1).await;
    let writer = agent(&env, 0, Duration::from_secs(30));
    let (stop, written) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writing = {
        let (stop, written, writer) = (stop.clone(), written.clone(), writer.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                writer
                    .update_key_value(&format!("w/{}", n % 10), n.to_string())
                    .await
                    .expect("write");
                n += 1;
                written.store(n, Ordering::Relaxed);
            }
            n
        })
    };
    let wait_written = |n: u64| {
        let written = written.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while written.load(Ordering::Relaxed) < n {
                assert!(Instant::now() < deadline, "writes stalled at {n}");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait_written(50).await;
    kill_leader(&mut env).await;
    let at_kill = written.load(Ordering::Relaxed);
    wait_written(at_kill + 50).await;
    stop.store(true, Ordering::Relaxed);
    let total = writing.await.expect("writer");
    // Every acknowledged write shows up once, in order.
    let deadline = Instant::now() + Duration::from_secs(30);
    while (seen.lock().expect("lock").len() as u64) < total {
        assert!(
            Instant::now() < deadline,
            "the watch fell behind: {} of {total}",
            seen.lock().expect("lock").len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let values: Vec<u64> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|c| {
            assert_eq!(c.kind, ChangeKind::Put);
            String::from_utf8_lossy(&c.value).parse().expect("number")
        })
        .collect();
    assert_eq!(
        values,
        (0..total).collect::<Vec<_>>(),
        "events lost, repeated or out of order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_ensemble_down_then_back() {
    let mut env = Env::start(3, &["--job", "worker=1"]).await;
    let a = agent(&env, 0, Duration::from_secs(2));
    a.insert_key_value("before", "1").await.expect("insert");
    for id in env.cluster.ids() {
        env.cluster.kill(id);
    }
    let started = Instant::now();
    let e = a
        .try_get_key_value("before")
        .await
        .expect_err("nobody serves");
    assert_eq!(e.code(), Code::Unavailable);
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "gave up before the deadline: {:?}",
        started.elapsed()
    );
    assert!(
        e.message().contains("no coordinator replica could serve"),
        "{e:?}"
    );
    for id in env.cluster.ids() {
        env.cluster.spawn(id);
    }
    env.cluster.wait_for_leader(LEADER_TIMEOUT).await;
    assert_eq!(
        a.try_get_key_value("before").await.expect("back"),
        Some(Bytes::from("1"))
    );
    a.insert_key_value("after", "2")
        .await
        .expect("insert after recovery");
}

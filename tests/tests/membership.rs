//! Membership changes at runtime (`coordctl member add|remove`): replicas join, leave and replace
//! dead ones under write load without losing an acknowledged write, and changes that would lose
//! quorum are refused.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_tests::{Cluster, ClusterOptions};
use tonic::Code;

fn client(endpoints: Vec<String>) -> CoordClient {
    CoordClient::new(ClientOptions::new(endpoints)).expect("client")
}

fn voters(members: &[coord_proto::coord::admin::Member]) -> BTreeSet<u64> {
    members.iter().filter(|m| m.voter).map(|m| m.id).collect()
}

/// Writes `w/<n>` keys until stopped, counting acknowledgements in `count`; returns the
/// acknowledged keys and the number of failed writes.
fn start_writer(
    c: CoordClient,
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<(Vec<String>, usize)> {
    tokio::spawn(async move {
        let (mut acked, mut failed) = (Vec::new(), 0);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("w/{n}");
            n += 1;
            match c.insert(&key, key.clone().into_bytes(), false).await {
                Ok(()) => {
                    acked.push(key);
                    count.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => failed += 1,
            }
        }
        (acked, failed)
    })
}

/// Waits until the writer has had `n` more writes acknowledged: the load runs across every
/// change.
async fn writes_go_on(count: &AtomicUsize, n: usize) {
    let target = count.load(Ordering::Relaxed) + n;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count.load(Ordering::Relaxed) < target {
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes stalled at {}",
            count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_join_leave_and_replace_the_dead_without_losing_a_write() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let admin = client(cluster.endpoints());
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let writer = start_writer(client(cluster.endpoints()), stop.clone(), count.clone());
    writes_go_on(&count, 20).await;

    // A fourth replica joins.
    let four = cluster.start_joining();
    cluster.wait_serving(four, Duration::from_secs(30)).await;
    let addr4 = cluster.replica(four).grpc.to_string();
    let members = admin.add_member(four, &addr4).await.expect("add 4");
    assert_eq!(voters(&members), BTreeSet::from([1, 2, 3, four]));
    // Adding it again is a retry of a change that happened: no error, no change.
    let again = admin.add_member(four, &addr4).await.expect("add 4 again");
    assert_eq!(voters(&again), BTreeSet::from([1, 2, 3, four]));

    writes_go_on(&count, 20).await;
    // A follower leaves, and is stopped.
    let gone = cluster.other_than(leader);
    let members = admin.remove_member(gone).await.expect("remove");
    assert!(!members.iter().any(|m| m.id == gone), "{members:?}");
    cluster.terminate(gone, Duration::from_secs(10));

    writes_go_on(&count, 20).await;
    // The other original follower dies; it is removed and replaced by a fifth replica.
    let dead = [1, 2, 3]
        .into_iter()
        .find(|&i| i != leader && i != gone)
        .expect("a follower");
    cluster.kill(dead);
    let members = admin.remove_member(dead).await.expect("remove the dead");
    assert_eq!(voters(&members), BTreeSet::from([leader, four]));
    writes_go_on(&count, 20).await;
    let five = cluster.start_joining();
    cluster.wait_serving(five, Duration::from_secs(30)).await;
    let addr5 = cluster.replica(five).grpc.to_string();
    let members = admin.add_member(five, &addr5).await.expect("add 5");
    assert_eq!(voters(&members), BTreeSet::from([leader, four, five]));

    writes_go_on(&count, 20).await;
    stop.store(true, Ordering::Relaxed);
    let (acked, failed) = writer.await.expect("writer");
    eprintln!(
        "{} writes acknowledged, {failed} failed during the changes",
        acked.len()
    );

    // The new replicas hold every acknowledged write, and every member agrees.
    let running = [leader, four, five];
    let last = cluster.status(leader).expect("leader status").last_applied;
    for id in running {
        cluster
            .wait_applied(id, last, Duration::from_secs(60))
            .await;
    }
    cluster
        .wait_until(
            Duration::from_secs(30),
            "every member to report the same membership and leader",
            |c| {
                running.iter().all(|&id| {
                    c.status(id)
                        .is_some_and(|s| s.leader_id == Some(leader) && s.last_applied >= last)
                })
            },
        )
        .await;
    // Read through the newest replica only (it forwards to the leader).
    let reader = client(vec![addr5.clone()]);
    for k in &acked {
        let v = reader.try_get(k).await.expect("read");
        assert_eq!(v.as_deref(), Some(k.as_bytes()), "acknowledged write {k}");
    }

    // The new configuration survives the loss of its leader.
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    assert!([four, five].contains(&new_leader));
    let c = client(vec![addr4, addr5]);
    c.insert("after", b"ok".to_vec(), false)
        .await
        .expect("writes commit on the new configuration");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_that_would_lose_quorum_are_refused() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let admin = client(cluster.endpoints());
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|&i| i != leader).collect();
    let (down, up) = (followers[0], followers[1]);
    cluster.kill(down);

    // Removing the healthy follower would leave {leader, down}: one of two answers.
    let err = admin.remove_member(up).await.expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains(&format!("not answering: {down}")),
        "{err:?}"
    );
    // A replica that is not running cannot be added.
    let nowhere = coord_tests::cluster::free_ports(1)[0];
    let err = admin
        .add_member(9, &format!("127.0.0.1:{nowhere}"))
        .await
        .expect_err("refused");
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("replica 9"), "{err:?}");
    // Unknown ids, and ids already taken by another address.
    let err = admin.remove_member(42).await.expect_err("no such member");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = admin
        .add_member(up, "127.0.0.1:1")
        .await
        .expect_err("id taken");
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");

    // Nothing changed...
    let members = client(vec![cluster.replica(leader).grpc.to_string()])
        .status_of(0)
        .await
        .expect("leader status")
        .members;
    assert_eq!(voters(&members), BTreeSet::from([1, 2, 3]));
    // ... and removing the dead replica itself is allowed: the two that answer remain.
    let members = admin
        .remove_member(down)
        .await
        .expect("remove the dead one");
    assert_eq!(voters(&members), BTreeSet::from([leader, up]));
    admin
        .insert("still", b"writable".to_vec(), false)
        .await
        .expect("the ensemble still commits");
}

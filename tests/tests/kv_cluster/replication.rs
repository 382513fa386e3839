//! How entries reach the followers: a lone write is pre-appended on a follower while the leader
//! syncs it (and only on a follower that keeps up), and AppendEntries go over the Raft links
//! unless they are turned off. Every write is read back either way.

use bytes::Bytes;
use coord_tests::{Cluster, ClusterOptions};

use super::{client_via, started, LEADER_TIMEOUT};

/// A lone write goes to a follower while the leader syncs it (a pre-append), and the follower's
/// log takes it: the counters on both sides move, and every write is read back, also after the
/// leader is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lone_writes_reach_a_follower_before_the_leaders_sync() {
    let (mut c, leader, client) = started(ClusterOptions::default()).await;
    let n = 50;
    for i in 0..n {
        client
            .insert(&format!("lone/{i}"), format!("v{i}"), false)
            .await
            .expect("insert");
    }
    let sent = c.metric(leader, "coord_pre_appends_sent_total");
    let written: f64 = c
        .ids()
        .into_iter()
        .filter(|id| *id != leader)
        .map(|id| c.metric(id, "coord_pre_appends_written_total"))
        .sum();
    // The first writes go the usual way while the connection is made.
    assert!(
        sent >= f64::from(n) / 2.0,
        "{sent} of {n} lone writes sent ahead"
    );
    assert!(
        written >= 1.0,
        "followers wrote {written} of {sent} pre-appends"
    );

    c.kill(leader);
    let next = c.wait_for_leader(LEADER_TIMEOUT).await;
    assert_ne!(next, leader);
    let dir = client
        .get_dir("lone")
        .await
        .expect("get_dir after the leader's death");
    assert_eq!(dir.len(), n as usize);
    for (k, v) in dir {
        let i = k.strip_prefix("lone/").expect("key");
        assert_eq!(v, Bytes::from(format!("v{i}")));
    }
}

/// A follower that stops keeping up (here: paused) no longer gets the leader's pre-appends; the
/// one that keeps up does, so lone writes still have their syncs overlapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_appends_go_to_the_follower_that_keeps_up() {
    let (c, leader, client) = started(ClusterOptions::default()).await;
    for i in 0..20 {
        client
            .insert(&format!("warm/{i}"), "v", false)
            .await
            .expect("insert");
    }
    let written = |c: &Cluster, id| c.metric(id, "coord_pre_appends_written_total");
    let followers: Vec<u64> = c.ids().into_iter().filter(|id| *id != leader).collect();
    let (a, b) = (followers[0], followers[1]);
    let (taker, other) = if written(&c, a) >= written(&c, b) {
        (a, b)
    } else {
        (b, a)
    };
    assert!(written(&c, taker) >= 1.0, "no follower took a pre-append");

    c.pause(taker);
    // The first of these find the paused follower level with the other and open the
    // connection to the other.
    let lone = |i| format!("lone/{i}");
    for i in 0..10 {
        client.insert(&lone(i), "v", false).await.expect("insert");
    }
    // What reached `other`: written, or passed by because the leader's AppendEntries brought the
    // entry first (a race that a loaded machine decides either way; which follower a pre-append
    // goes to is what this test is about).
    let received =
        |c: &Cluster| written(c, other) + c.metric(other, "coord_pre_appends_passed_total");
    let before = received(&c);
    let n = 40;
    for i in 10..10 + n {
        client
            .insert(&lone(i), "v", false)
            .await
            .expect("insert with one follower paused");
    }
    let taken = received(&c) - before;
    c.resume(taker);
    assert!(
        taken >= f64::from(n) * 0.75,
        "replica {other} received {taken} of {n} lone writes' pre-appends while replica {taker} was paused"
    );
    let dir = client.get_dir("lone").await.expect("get_dir");
    assert_eq!(dir.len(), 10 + n as usize);
}

/// AppendEntries travel over the plain links (`raft_link`) of a plain ensemble, and over gRPC
/// only with `--no-raft-links`; both ways replicate every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_entries_go_over_links_unless_turned_off() {
    for links in [true, false] {
        let mut options = ClusterOptions::default();
        if !links {
            options.extra_args.push("--no-raft-links".into());
        }
        let (c, leader, client) = started(options).await;
        let n = 20;
        for i in 0..n {
            client
                .insert(&format!("linked/{i}"), "v", false)
                .await
                .expect("insert");
        }
        let calls = c.metric(leader, "coord_raft_link_calls_total");
        if links {
            // Each write is at least one AppendEntries with its entry to each follower.
            assert!(
                calls >= f64::from(n),
                "{calls} calls over links for {n} writes"
            );
        } else {
            assert_eq!(calls, 0.0, "links were turned off");
        }
        let follower = c.other_than(leader);
        let dir = client_via(&c, follower)
            .get_dir("linked")
            .await
            .expect("get_dir through a follower");
        assert_eq!(dir.len(), n as usize, "links {links}");
    }
}

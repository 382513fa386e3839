//! Fault injection in CI: short seeded chaos runs, targeted partitions of the leader, and a short
//! crash-consistency loop. `coord-bench chaos` and `coord-bench crash` run the long versions.
//!
//! The seeds are fixed so that a failure replays; `COORD_CHAOS_SEED` adds a run with another.

use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_tests::chaos::crash::{crash_loop, CrashOptions};
use coord_tests::chaos::netproxy::Cut;
use coord_tests::chaos::runner::{run_clean, RunOptions};
use coord_tests::{Cluster, ClusterOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_fault_schedules_keep_every_guarantee() {
    let mut seeds = vec![1, 2];
    if let Some(s) = std::env::var("COORD_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        seeds.push(s);
    }
    for seed in seeds {
        let report = run_clean(&RunOptions::new(seed, Duration::from_secs(25))).await;
        assert!(
            report.faults >= 3,
            "the schedule injected faults: {}",
            report.summary()
        );
        assert!(
            report.kv_ops > 100,
            "the clients got work done: {}",
            report.summary()
        );
        assert!(
            report.barrier_passes > 0,
            "barriers passed: {}",
            report.summary()
        );
        assert!(
            report.alive_rounds > 0 && report.alive_answers > 0,
            "the XLA job's GetAliveTasks rounds finished: {}",
            report.summary()
        );
        assert!(
            report.raw_ops > 50,
            "the raw-key (torch store) clients got work done: {}",
            report.summary()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_loses_no_acknowledged_write() {
    let report = crash_loop(&CrashOptions {
        cycles: 12,
        seed: 11,
        clients: 6,
        kill_all_ratio: 0.3,
        tls: false,
    })
    .await;
    eprintln!("crash loop: {}", report.summary());
    assert!(report.anomalies.is_empty(), "{:#?}", report.anomalies);
    assert_eq!(report.cycles, 12);
    assert!(report.acked_inserts > 0);
}

/// The same over TLS, where AppendEntries and pre-appends take TLS links that every restart
/// makes afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_over_tls_loses_no_acknowledged_write() {
    let report = crash_loop(&CrashOptions {
        cycles: 6,
        seed: 26,
        clients: 6,
        kill_all_ratio: 0.3,
        tls: true,
    })
    .await;
    eprintln!("crash loop over TLS: {}", report.summary());
    assert!(report.anomalies.is_empty(), "{:#?}", report.anomalies);
    assert_eq!(report.cycles, 6);
    assert!(report.acked_inserts > 0);
}

fn client(endpoints: &[String]) -> CoordClient {
    let mut o = ClientOptions::new(endpoints.to_vec());
    o.unavailable_after = Duration::from_secs(20);
    CoordClient::new(o).expect("client")
}

/// A leader cut off from both followers (packets dropped, connections kept open) must not
/// acknowledge anything; the majority elects a new leader and goes on; when the partition heals,
/// the old leader steps down and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolated_leader_is_replaced_and_rejoins() {
    for how in [Cut::Blackhole, Cut::Refuse] {
        let mut cluster = Cluster::start(ClusterOptions {
            proxied: true,
            ..ClusterOptions::default()
        });
        let old = cluster.wait_for_leader(Duration::from_secs(30)).await;
        let c = client(&cluster.endpoints());
        c.insert("before", "1", false)
            .await
            .expect("put before the partition");

        cluster.net().isolate(old, how);
        // A client that only knows the old leader gets no acknowledgement from it.
        let only_old = {
            let mut o = ClientOptions::new(vec![cluster.replica(old).grpc.to_string()]);
            o.unavailable_after = Duration::from_secs(2);
            CoordClient::new(o).expect("client")
        };
        let stale = only_old.insert("stale", "x", true).await;
        assert!(
            stale.is_err(),
            "{how:?}: an isolated leader acknowledged a write: {stale:?}"
        );

        // The majority side elects a leader and serves.
        let survivors: Vec<String> = cluster
            .ids()
            .into_iter()
            .filter(|&id| id != old)
            .map(|id| cluster.replica(id).grpc.to_string())
            .collect();
        client(&survivors)
            .insert("during", "2", false)
            .await
            .expect("majority serves");

        cluster.net().heal_all();
        let new = cluster.wait_for_leader(Duration::from_secs(30)).await;
        let all = client(&cluster.endpoints());
        all.insert("after", "3", false)
            .await
            .expect("put after healing");
        // The old leader rejoins and applies everything (including what it missed).
        let s = cluster.status(new).expect("leader status");
        cluster
            .wait_applied(old, s.last_applied, Duration::from_secs(30))
            .await;
        for (k, v) in [("before", "1"), ("during", "2"), ("after", "3")] {
            assert_eq!(
                all.get(k).await.expect("get").as_ref(),
                v.as_bytes(),
                "{how:?}: key {k}"
            );
        }
        // The write sent to the isolated leader either never happened or happened once; it
        // was never acknowledged, so either is allowed, but it must not be half there.
        let stale = all.try_get("stale").await.expect("read stale");
        assert!(stale.is_none() || stale.as_deref() == Some(b"x".as_slice()));
    }
}

/// One-way cuts between the leader and a follower (either direction) must not wedge clients:
/// the follower may accept calls it cannot complete (its forwards to the leader go unanswered, or
/// it lost the leader and cannot win an election), so a client whose first choice is that
/// follower must get its calls served elsewhere well within its patience. Before forwards were
/// tied to the follower's belief in its leader, and quick calls to an attempt timeout, such a
/// client stalled for 12-15 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_way_cuts_do_not_wedge_clients() {
    // Far more than a call needs (a few ms) or than moving to another replica takes (about 2 s),
    // far less than the stalls this guards against.
    const PATIENCE: Duration = Duration::from_secs(8);
    for leader_to_follower in [true, false] {
        let mut cluster = Cluster::start(ClusterOptions {
            proxied: true,
            ..ClusterOptions::default()
        });
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        let follower = cluster.other_than(leader);
        if leader_to_follower {
            cluster.net().cut(leader, follower, Cut::Blackhole);
        } else {
            cluster.net().cut(follower, leader, Cut::Blackhole);
        }
        // The cut follower first: every call starts there.
        let mut endpoints = vec![cluster.replica(follower).grpc.to_string()];
        endpoints.extend(
            cluster
                .ids()
                .into_iter()
                .filter(|&id| id != follower)
                .map(|id| cluster.replica(id).grpc.to_string()),
        );
        // Our client, and one that never gives up on an attempt (like a plain gRPC client): the
        // replicas themselves must not hold its calls.
        let ours = ClientOptions::new(Vec::new()).attempt_timeout;
        for attempt_timeout in [ours, Duration::from_secs(3600)] {
            let mut o = ClientOptions::new(endpoints.clone());
            o.unavailable_after = PATIENCE;
            o.attempt_timeout = attempt_timeout;
            let c = CoordClient::new(o).expect("client");
            let what = format!(
                "leader->follower cut: {leader_to_follower}, attempt timeout {attempt_timeout:?}"
            );
            for n in 0..10 {
                let value = format!("v{n}");
                let write = c.insert("k", value.clone(), true);
                tokio::time::timeout(PATIENCE, write)
                    .await
                    .unwrap_or_else(|_| panic!("write {n} ({what}) hung for {PATIENCE:?}"))
                    .unwrap_or_else(|e| panic!("write {n} ({what}): {e}"));
                let read = tokio::time::timeout(PATIENCE, c.try_get("k"))
                    .await
                    .unwrap_or_else(|_| panic!("read {n} ({what}) hung for {PATIENCE:?}"))
                    .unwrap_or_else(|e| panic!("read {n} ({what}): {e}"));
                assert_eq!(read.as_deref(), Some(value.as_bytes()));
            }
        }
        cluster.net().heal_all();
        cluster.wait_for_leader(Duration::from_secs(30)).await;
        let c = CoordClient::new(ClientOptions::new(cluster.endpoints())).expect("client");
        assert_eq!(c.get("k").await.expect("get").as_ref(), b"v9");
    }
}

/// A leader cut off with writes in its proposer, deposed, and brought back by a snapshot (the new
/// leader compacted its log past everything the old one held) must commit writes again when it
/// leads again. openraft 0.9 answers a waiting write only when its entry is applied or truncated
/// as a conflict; installing a snapshot over a shorter log does neither, and the proposer used to
/// keep that write's entry slot for good: leading again, the replica served reads but never
/// proposed another write (chaos seed 424243: 47 s without a write, with a leader in office).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_deposed_with_writes_in_flight_writes_again() {
    // Far more than a write needs, far less than the stall this guards against (forever).
    const PATIENCE: Duration = Duration::from_secs(10);
    let mut cluster = Cluster::start(ClusterOptions {
        proxied: true,
        extra_args: [
            // One slot, so that one slot kept is a proposer that never proposes again.
            "--max-inflight-proposals",
            "1",
            // The new leader soon compacts past the old leader's log.
            "--snapshot-every-entries",
            "100",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    // Replica 1, which wins the election that follows a leader's death when it can (see `lead`).
    let old = 1;
    lead(&mut cluster, old).await;
    client(&cluster.endpoints())
        .insert("before", "1", false)
        .await
        .expect("put before the partition");

    // Writes reach the leader while it is cut off: the first takes the proposer's slot, the
    // others queue behind it and are proposed together once the first gives up (when the lease
    // runs out), into an entry that can never commit.
    // Refused rather than dropped: no AppendEntries of the new leader held up in the partition
    // may reach the old leader after it heals (one would truncate the old leader's entries as
    // conflicts, which answers their writes).
    cluster.net().isolate(old, Cut::Refuse);
    let only_old = {
        let mut o = ClientOptions::new(vec![cluster.replica(old).grpc.to_string()]);
        o.unavailable_after = Duration::from_secs(3);
        CoordClient::new(o).expect("client")
    };
    let keys: Vec<String> = (0..8).map(|i| format!("stale/{i}")).collect();
    let stale = futures::future::join_all(keys.iter().map(|k| only_old.insert(k, "x", true))).await;
    assert!(
        stale.iter().all(Result::is_err),
        "an isolated leader acknowledged a write: {stale:?}"
    );
    let old_last = cluster
        .status(old)
        .expect("old leader's status")
        .last_log_index;

    // The majority goes on until its snapshot and purge have passed the old leader's log.
    let survivors: Vec<String> = cluster
        .ids()
        .into_iter()
        .filter(|&id| id != old)
        .map(|id| cluster.replica(id).grpc.to_string())
        .collect();
    let majority = client(&survivors);
    let keys: Vec<String> = (0..4).map(|w| format!("during/{w}")).collect();
    for round in 0u64.. {
        let writers = keys
            .iter()
            .map(|k| majority.insert(k, round.to_string(), true));
        for r in futures::future::join_all(writers).await {
            r.expect("the majority serves");
        }
        let purged = cluster
            .ids()
            .into_iter()
            .filter(|&id| id != old)
            .filter_map(|id| cluster.status(id))
            .find(|s| s.state == "Leader")
            .map_or(0, |s| s.purged_index);
        if purged > old_last + 10 {
            break;
        }
        assert!(
            round < 20_000,
            "the majority never compacted past index {old_last}"
        );
    }

    // Healed, the old leader steps down and catches up from a snapshot past its whole log.
    cluster.net().heal_all();
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let applied = cluster.status(leader).expect("leader status").last_applied;
    cluster
        .wait_applied(old, applied, Duration::from_secs(30))
        .await;
    let s = cluster.status(old).expect("old leader's status");
    assert!(
        s.snapshot_index > old_last,
        "the old leader caught up from its log (snapshot {}, its log ended at {old_last})",
        s.snapshot_index
    );

    // It leads again, and must commit writes.
    lead(&mut cluster, old).await;
    let all = client(&cluster.endpoints());
    for i in 0..3 {
        tokio::time::timeout(PATIENCE, all.insert(&format!("after/{i}"), "3", false))
            .await
            .unwrap_or_else(|_| panic!("write {i} hung for {PATIENCE:?} on leader {old}"))
            .unwrap_or_else(|e| panic!("write {i} on leader {old}: {e}"));
    }
    assert_eq!(all.get("before").await.expect("get").as_ref(), b"1");
    // The entry it proposed while cut off was given up when it stopped leading.
    assert!(cluster.metric(old, "coord_proposal_abandoned_leader_lost_total") >= 1.0);
    assert!(cluster.metric(old, "coord_proposal_stalled_seconds") < 1.0);
}

/// Moves leadership to `id` by killing whoever else leads (and restarting it), once `id`'s log
/// has caught up. The survivors' election is not left to chance: a voter that hears from no
/// leader starts one after a delay that grows with its rank by id (`election`), so the lowest id
/// among them wins.
async fn lead(cluster: &mut Cluster, id: u64) {
    for _ in 0..10 {
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        if leader == id {
            return;
        }
        let last = cluster.status(leader).map_or(0, |s| s.last_log_index);
        cluster
            .wait_until(
                Duration::from_secs(30),
                &format!("replica {id} to hold the leader's log"),
                |c| c.status(id).is_some_and(|s| s.last_log_index >= last),
            )
            .await;
        cluster.kill(leader);
        cluster.wait_for_leader(Duration::from_secs(30)).await;
        cluster.spawn(leader);
    }
    panic!("replica {id} never became leader");
}

/// A whole-ensemble crash: openraft 0.9 restores the old leader as leader of its term at once,
/// with the commit index it last persisted, which lags what it acknowledged. Here the follower
/// that restarts with it is far behind (it was frozen while the other follower formed the
/// quorum), so the leader's commit index stays stale until that follower catches up; reads in
/// that window must still see every acknowledged write. (Found by the crash-consistency loop:
/// an acknowledged insert missing from the first read after a restart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restored_leader_serves_nothing_stale() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let behind = cluster.other_than(leader);
    let partner = cluster
        .ids()
        .into_iter()
        .find(|&id| id != leader && id != behind)
        .expect("a third replica");
    // Frozen, so that it neither receives the writes nor starts elections.
    cluster.pause(behind);
    // One writer, so that nothing is appended after the last acknowledgement: the leader's
    // persisted commit index then lags by the last write. Large values make the frozen
    // follower's catch-up after the restart (the window for a stale read) take a while.
    let c = client(&cluster.endpoints());
    let mut acked = Vec::new();
    for n in 0..100 {
        let key = format!("w/{n:03}");
        c.insert(&key, vec![b'x'; 64 << 10], false)
            .await
            .expect("write with the partner as quorum");
        acked.push(key);
    }
    for id in [behind, partner, leader] {
        cluster.kill(id);
    }
    cluster.spawn(leader);
    cluster.spawn(behind);
    let reader = client(&[
        cluster.replica(leader).grpc.to_string(),
        cluster.replica(behind).grpc.to_string(),
    ]);
    let seen: std::collections::HashSet<String> = reader
        .get_dir("w")
        .await
        .expect("read after the restart")
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let missing: Vec<&String> = acked.iter().filter(|k| !seen.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "the first read after a whole-ensemble restart missed {} of {} acknowledged writes: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
}

/// A follower that cannot hear the leader (a one-way cut leader -> follower) must not raise its
/// term: it asks for pre-votes first, and the others, who hear the leader, refuse. When the cut
/// heals the leader is still in office, in the same term. Without Pre-Vote the cut follower's term
/// climbed to 26 in 8 s and deposed the leader when the cut healed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_way_cut_neither_inflates_the_term_nor_deposes_the_leader() {
    const CUT_FOR: Duration = Duration::from_secs(4);
    let mut cluster = Cluster::start(ClusterOptions {
        proxied: true,
        ..ClusterOptions::default()
    });
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let term = cluster.status(leader).map_or(0, |s| s.term);
    let follower = cluster.other_than(leader);
    let c = CoordClient::new(ClientOptions::new(cluster.endpoints())).expect("client");
    cluster.net().cut(leader, follower, Cut::Blackhole);
    // For many election timeouts (300 ms each), the cut follower's term stays put and the
    // ensemble keeps writing.
    let until = std::time::Instant::now() + CUT_FOR;
    let mut n = 0;
    while std::time::Instant::now() < until {
        c.insert("k", format!("v{n}"), true)
            .await
            .expect("write during the cut");
        n += 1;
        let seen = cluster.status(follower).map_or(0, |s| s.term);
        assert_eq!(seen, term, "the cut follower raised its term");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        cluster.log(follower).contains("not starting an election"),
        "the cut follower never asked for a pre-vote:\n{}",
        cluster.log(follower)
    );
    cluster.net().heal_all();
    let applied = cluster.status(leader).map_or(0, |s| s.last_log_index);
    cluster
        .wait_applied(follower, applied, Duration::from_secs(30))
        .await;
    assert_eq!(
        cluster.wait_for_leader(Duration::from_secs(30)).await,
        leader
    );
    for id in cluster.ids() {
        assert_eq!(
            cluster.status(id).map_or(0, |s| s.term),
            term,
            "replica {id}'s term after the cut healed"
        );
    }
}

//! TensorFlow's tf.data service through failures of the ensemble: real TF 2.21 `WorkerServer`s
//! and a `distribute()` reader (DYNAMIC sharding of `range(N)`), each worker behind its own
//! `coord-proxy` (which leases splits, up to 256 at a time), while
//! the leader is killed twice mid-epoch, or every replica is killed and restarted. TF must see
//! slow calls, never an error, and read every element exactly once: a split handed out is in the
//! log, and a GetSplit whose answer was lost with its leader is answered with the same split.
//! Two jobs of one job name in two namespaces read two epochs, not one split between them.
//! (The venv comes from PyPI; without it the tests skip, saying why.)

use std::time::{Duration, Instant};

use coord_agent::data::DispatchClient;
use coord_proto::coord::dispatcher as pb;
use coord_tests::cli::coordctl_json;
use coord_tests::cluster::free_ports;
use coord_tests::data::{dispatch_client, dispatch_client_in};
use coord_tests::jax::Sidecar;
use coord_tests::tf_service::{DatasetKind, Mode, ReadSpec, Reader, TfDataProcs, Worker};
use coord_tests::tfdata_conformance::{procs_or_skip, READ_PATIENCE, START_PATIENCE};
use coord_tests::{Cluster, ClusterOptions};

/// Elements (one split each) of the epoch: long enough, at a few hundred splits a second, for
/// both kills to land mid-epoch.
const N: u64 = 2000;

/// The split position of the one TensorFlow iteration: splits handed out of its first
/// repetition (N once the epoch is handed out; the next repetition starts at 0 again).
async fn position(d: &DispatchClient) -> Option<u64> {
    let reply = d.list_jobs(pb::ListJobsRequest {}).await.ok()?;
    let it = reply.tf_iterations.first()?;
    let p = it.splits.first()?;
    Some(if p.repetition > 0 { N } else { p.index })
}

/// Waits until the iteration's position reaches `at` (reading it from any replica that answers).
async fn wait_position(d: &DispatchClient, at: u64, what: &str) -> u64 {
    let deadline = Instant::now() + START_PATIENCE;
    loop {
        if let Some(p) = position(d).await.filter(|p| *p >= at) {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the split position never reached {at}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An ensemble, coord-proxy in front of it, two TF workers and a DYNAMIC reader of `range(N)`,
/// reading.
struct Epoch {
    cluster: Cluster,
    d: DispatchClient,
    _proxies: Vec<Sidecar>,
    workers: Vec<Worker>,
    reader: Reader,
}

async fn start_epoch(procs: &TfDataProcs) -> Epoch {
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(START_PATIENCE).await;
    // One coord-proxy per worker, as on separate hosts: their split leases compete.
    let proxies: Vec<Sidecar> = (0..2)
        .map(|_| Sidecar::start(&cluster.endpoints()))
        .collect();
    let d = dispatch_client(&cluster.endpoints());
    let spec = ReadSpec {
        progress_every: 500,
        ..ReadSpec::new(DatasetKind::Range(N), Mode::Dynamic)
    };
    let prepared = procs.prepare_readers(std::slice::from_ref(&spec));
    let workers = workers_behind(procs, &proxies).await;
    let reader = prepared
        .go(&proxies[0].addr)
        .pop()
        .unwrap_or_else(|| unreachable!("one spec, one reader"));
    Epoch {
        cluster,
        d,
        _proxies: proxies,
        workers,
        reader,
    }
}

/// One TF worker behind each of `proxies` (as on separate hosts), started at once and ready.
async fn workers_behind(procs: &TfDataProcs, proxies: &[Sidecar]) -> Vec<Worker> {
    let starting: Vec<_> = proxies
        .iter()
        .zip(free_ports(proxies.len()))
        .map(|(p, port)| procs.start_worker(&p.addr, Some(port)))
        .collect();
    let mut workers = Vec::new();
    for w in starting {
        workers.push(w.ready(START_PATIENCE).await);
    }
    workers
}

/// `reader`'s epoch completes with every element exactly once, and none of `workers` saw an
/// error.
async fn finishes_exactly_once(reader: &Reader, workers: &[Worker], what: &str) {
    let read = reader
        .finish(READ_PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("{what}: the reader saw an error: {e}"));
    assert_eq!(
        read.sorted(),
        (0..N as i64).collect::<Vec<_>>(),
        "{what}: not every element exactly once ({} read)",
        read.elements.len()
    );
    for w in workers {
        assert!(
            w.errors().is_empty(),
            "{what}: worker {} reported {:?}",
            w.address,
            w.errors()
        );
    }
}

impl Epoch {
    /// The epoch completes with every element exactly once, and no TF process saw an error.
    async fn finishes_exactly_once(&self, what: &str) {
        finishes_exactly_once(&self.reader, &self.workers, what).await
    }
}

/// `coordctl dispatcher jobs|workers|journal` and `/metrics` show TensorFlow's iteration, its
/// workers and its journal after the epoch.
async fn operators_see_the_epoch(e: &mut Epoch) {
    let eps = e.cluster.endpoints();
    let jobs = coordctl_json(&eps, &["dispatcher", "jobs"]);
    let rows: Vec<&serde_json::Value> = jobs
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| r["service"] == "tensorflow")
        .collect();
    assert_eq!(rows.len(), 1, "{jobs}");
    let it = rows[0];
    assert_eq!(it["mode"], "DYNAMIC", "{it}");
    assert_eq!(it["tasks"], 2, "{it}");
    // The epoch is handed out: the provider is on its next repetition.
    assert_eq!(it["splits"], "r1:0/2000", "{it}");
    let workers = coordctl_json(&eps, &["dispatcher", "workers"]);
    let addresses: Vec<&str> = workers
        .as_array()
        .expect("rows")
        .iter()
        .filter(|w| w["service"] == "tensorflow")
        .filter_map(|w| w["address"].as_str())
        .collect();
    for w in &e.workers {
        assert!(addresses.contains(&w.address.as_str()), "{workers}");
    }
    let journal = coordctl_json(&eps, &["dispatcher", "journal", "--limit", "100000"]);
    let splits = tf_splits_in(&journal);
    // Every split is in the journal, in the proxies' leases (up to 256 at a time, fewer at the
    // start and the end of the epoch; and the end-of-splits answers after them).
    assert!(
        splits >= N as usize / 256,
        "{splits} GetSplit updates in the journal"
    );
    // Every replica counts the same splits once caught up.
    for id in e.cluster.ids() {
        e.cluster
            .wait_until(START_PATIENCE, "every split counted", |c| {
                c.metric(id, "coord_tfdata_splits_total") == N as f64
            })
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_epoch_survives_two_leader_kills() {
    let test = "dynamic_epoch_survives_two_leader_kills";
    let Some(procs) = procs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let mut e = start_epoch(&procs).await;
    let mut kills = Vec::new();
    for (i, at) in [N / 5, N / 2].into_iter().enumerate() {
        let before = wait_position(&e.d, at, "before the kill").await;
        let leader = e.cluster.wait_for_leader(START_PATIENCE).await;
        e.cluster.kill(leader);
        let killed_at = Instant::now();
        // The next leader hands out splits again (on to the next kill's mark).
        let after = wait_position(&e.d, before + 50, "after the kill").await;
        kills.push((leader, before, killed_at.elapsed()));
        eprintln!(
            "kill {}: leader {leader} at split {before}; split {after} handed out {:.2?} later",
            i + 1,
            killed_at.elapsed()
        );
        // Back (and caught up) before the next kill, which must leave a majority.
        e.cluster.spawn(leader);
        e.cluster.wait_serving(leader, START_PATIENCE).await;
    }
    e.finishes_exactly_once("two leader kills").await;
    assert_ne!(
        kills[0].0, kills[1].0,
        "the same replica led twice in a row"
    );
    operators_see_the_epoch(&mut e).await;
    eprintln!("{test}: {:.1?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_resumes_at_its_split_position_after_a_full_restart() {
    let test = "an_epoch_resumes_at_its_split_position_after_a_full_restart";
    let Some(procs) = procs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let mut e = start_epoch(&procs).await;
    wait_position(&e.d, N / 3, "before the restart").await;
    let ids = e.cluster.ids();
    for id in &ids {
        e.cluster.kill(*id);
    }
    let position_at_kill = {
        // Every replica is down: what the log holds is what the restart must find.
        for id in &ids {
            e.cluster.spawn(*id);
        }
        e.cluster.wait_for_leader(START_PATIENCE).await;
        position(&e.d)
            .await
            .expect("the iteration after the restart")
    };
    eprintln!(
        "restarted at split {position_at_kill}, {:.1?} into the test",
        started.elapsed()
    );
    assert!(
        position_at_kill >= N / 3,
        "the position went back to {position_at_kill}"
    );
    wait_position(&e.d, position_at_kill + 50, "after the restart").await;
    eprintln!(
        "splits handed out again {:.1?} into the test",
        started.elapsed()
    );
    e.finishes_exactly_once("a full restart").await;
    eprintln!("{test}: {:.1?}", started.elapsed());
}

/// Two tf.data jobs with the same job name and dataset, each in its own namespace behind its own
/// `coord-proxy --namespace`, through a leader kill: each reader reads its whole epoch exactly
/// once (one dispatcher would split one epoch between the two readers), each namespace's
/// dispatcher holds its own iteration, worker and journal, and the default namespace's none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_job_name_in_two_namespaces_is_two_epochs_through_a_leader_kill() {
    let test = "one_job_name_in_two_namespaces_is_two_epochs_through_a_leader_kill";
    let Some(procs) = procs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(START_PATIENCE).await;
    let eps = cluster.endpoints();
    let names = ["team-a", "team-b"];
    let proxies: Vec<Sidecar> = names
        .iter()
        .map(|n| Sidecar::start_with(&eps, &["--namespace".to_string(), n.to_string()]))
        .collect();
    let spec = ReadSpec {
        job_name: Some("shared".into()),
        progress_every: 500,
        ..ReadSpec::new(DatasetKind::Range(N), Mode::Dynamic)
    };
    let prepared: Vec<_> = names
        .iter()
        .map(|_| procs.prepare_readers(std::slice::from_ref(&spec)))
        .collect();
    let workers = workers_behind(&procs, &proxies).await;
    let readers: Vec<Reader> = prepared
        .into_iter()
        .zip(&proxies)
        .map(|(p, proxy)| p.go(&proxy.addr).pop().expect("one spec, one reader"))
        .collect();
    let clients: Vec<DispatchClient> = names
        .iter()
        .map(|n| dispatch_client_in(&eps, Some(n)))
        .collect();
    // Both epochs under way, then kill -9 the leader.
    for d in &clients {
        wait_position(d, N / 4, "before the kill").await;
    }
    let leader = cluster.wait_for_leader(START_PATIENCE).await;
    cluster.kill(leader);
    eprintln!(
        "{test}: leader {leader} killed {:.1?} into the test",
        started.elapsed()
    );
    for ((name, reader), worker) in names.iter().zip(&readers).zip(&workers) {
        finishes_exactly_once(reader, std::slice::from_ref(worker), name).await;
    }
    for ((name, d), worker) in names.iter().zip(&clients).zip(&workers) {
        let jobs = d.list_jobs(pb::ListJobsRequest {}).await.expect("jobs");
        let named: Vec<&str> = jobs
            .tf_iterations
            .iter()
            .map(|it| it.job_name.as_str())
            .collect();
        assert_eq!(named, ["shared"], "{name}: {jobs:?}");
        let ws = d
            .get_workers(pb::GetWorkersRequest {})
            .await
            .expect("workers");
        let addresses: Vec<&str> = ws.tf_workers.iter().map(|w| w.address.as_str()).collect();
        assert_eq!(addresses, [worker.address.as_str()], "{name}");
        let journal = coordctl_json(
            &eps,
            &["-n", name, "dispatcher", "journal", "--limit", "100000"],
        );
        let splits = tf_splits_in(&journal);
        assert!(
            splits >= N as usize / 256,
            "{name}: {splits} GetSplit updates in its journal"
        );
    }
    // The default namespace's dispatcher saw none of it.
    let default = dispatch_client(&eps);
    let jobs = default
        .list_jobs(pb::ListJobsRequest {})
        .await
        .expect("jobs");
    assert!(
        jobs.tf_iterations.is_empty() && jobs.jobs.is_empty(),
        "the default namespace: {jobs:?}"
    );
    let ws = default
        .get_workers(pb::GetWorkersRequest {})
        .await
        .expect("workers");
    assert!(ws.tf_workers.is_empty(), "the default namespace: {ws:?}");
    let journal = coordctl_json(&eps, &["dispatcher", "journal", "--limit", "100000"]);
    assert_eq!(tf_splits_in(&journal), 0, "the default namespace's journal");
    eprintln!("{test}: {:.1?}", started.elapsed());
}

/// GetSplit updates in a journal as `coordctl -o json dispatcher journal` prints it.
fn tf_splits_in(journal: &serde_json::Value) -> usize {
    journal["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| {
            e["update"]
                .as_str()
                .is_some_and(|u| u.starts_with("tfdata.get_split("))
        })
        .count()
}

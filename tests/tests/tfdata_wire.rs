//! TensorFlow 2.21's tf.data service on coord: real `WorkerServer`s and `distribute()` readers
//! (`tensorflow-cpu` from PyPI, in a venv the tests make; they skip, saying why, where it cannot
//! be had) run each scenario of `coord_tests::tfdata_conformance` against TensorFlow's own
//! `DispatchServer` and against a 3-replica ensemble, in the same test; each outcome is checked
//! for what TF guarantees, and the two are compared read by read (multisets of elements, error
//! codes).
//!
//! The ensemble is reached as users reach it: through `coord-proxy`, or straight through a
//! follower replica (which forwards every call to the leader).

use std::time::Instant;

use coord_tests::cluster::free_ports;
use coord_tests::jax::Sidecar;
use coord_tests::tf_service::{BadInput, CallOutcome, StartingWorker};
use coord_tests::tfdata_conformance::{
    bad, joins, localhost, modes, procs_or_skip, summary, TestFiles, START_PATIENCE,
};
use coord_tests::{Cluster, ClusterOptions};

/// A 3-replica ensemble whose tf.data dispatcher has `workers` as its fixed worker list.
fn ensemble(workers: &[String]) -> Cluster {
    let mut extra_args = Vec::new();
    if !workers.is_empty() {
        extra_args = vec!["--tfdata-worker-addresses".into(), workers.join(",")];
    }
    Cluster::start(ClusterOptions {
        extra_args,
        ..ClusterOptions::default()
    })
}

/// How TensorFlow's processes reach the ensemble.
#[derive(Clone, Copy, Debug)]
enum Via {
    Proxy,
    Follower,
}

/// The dispatcher address TF is given, and what must live as long as it is used.
async fn address(cluster: &mut Cluster, via: Via) -> (String, Option<Sidecar>) {
    let leader = cluster.wait_for_leader(START_PATIENCE).await;
    match via {
        Via::Proxy => {
            let proxy = Sidecar::start(&cluster.endpoints());
            (proxy.addr.clone(), Some(proxy))
        }
        Via::Follower => {
            let follower = cluster.other_than(leader);
            (cluster.replica(follower).grpc.to_string(), None)
        }
    }
}

/// A worker outside the fixed list is refused with TF's error.
async fn refused_outside_the_list(stranger: StartingWorker) {
    match stranger.started(START_PATIENCE).await {
        Ok(w) => panic!("worker {} outside the list was taken", w.address),
        Err(e) => assert!(
            e.message.contains("Failed to assign an index for worker"),
            "{e}"
        ),
    }
}

/// Every mode with `workers` workers on TF's dispatcher, then on the ensemble; both checked, then
/// compared.
async fn every_mode(test: &str, workers: usize, via: Via) {
    let Some(procs) = procs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let files = TestFiles::make(&procs);
    let ports = free_ports(workers + 1);
    let (listed, stranger) = ports.split_at(workers);

    let tf_reads = {
        let dispatcher = procs.own_dispatcher(&localhost(listed));
        let stranger = procs.start_worker(&dispatcher.address, Some(stranger[0]));
        let (_, reads) = tokio::join!(
            dispatcher.ready(START_PATIENCE),
            modes::every_mode(&procs, &dispatcher.address, listed, &files)
        );
        modes::check_every_mode(&reads, workers, &files);
        refused_outside_the_list(stranger).await;
        reads
    };
    eprintln!(
        "{test}: TensorFlow's dispatcher done at {:.1?}",
        started.elapsed()
    );

    let coord_reads = {
        let mut cluster = ensemble(&localhost(listed));
        let (dispatcher, _proxy) = address(&mut cluster, via).await;
        let stranger = procs.start_worker(&dispatcher, Some(stranger[0]));
        let reads = modes::every_mode(&procs, &dispatcher, listed, &files).await;
        modes::check_every_mode(&reads, workers, &files);
        refused_outside_the_list(stranger).await;
        reads
    };
    assert_eq!(
        summary(&coord_reads),
        summary(&tf_reads),
        "coord (through {via:?}) and TensorFlow's dispatcher read differently"
    );
    eprintln!("{test}: {:.1?} in all", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_with_two_workers_through_a_follower() {
    every_mode(
        "every_mode_with_two_workers_through_a_follower",
        2,
        Via::Follower,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_with_four_workers_through_coord_proxy() {
    every_mode(
        "every_mode_with_four_workers_through_coord_proxy",
        4,
        Via::Proxy,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_added_mid_job_joins_round_robin_and_plain_jobs() {
    let test = "a_worker_added_mid_job_joins_round_robin_and_plain_jobs";
    let Some(procs) = procs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    {
        let dispatcher = procs.own_dispatcher(&[]);
        let ports = free_ports(2);
        let (_, run) = tokio::join!(
            dispatcher.ready(START_PATIENCE),
            joins::worker_added_mid_job(&procs, &dispatcher.address, &ports)
        );
        joins::check_worker_added(&run);
    }
    eprintln!(
        "{test}: TensorFlow's dispatcher done at {:.1?}",
        started.elapsed()
    );
    let mut cluster = ensemble(&[]);
    let (dispatcher, _proxy) = address(&mut cluster, Via::Proxy).await;
    let run = joins::worker_added_mid_job(&procs, &dispatcher, &free_ports(2)).await;
    joins::check_worker_added(&run);
    eprintln!("{test}: {:.1?} in all", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_tfs_errors() {
    let test = "bad_input_gets_tfs_errors";
    let Some(procs) = procs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let tf_outcomes = {
        let dispatcher = procs.own_dispatcher(&[]);
        let (_, outcomes) = tokio::join!(
            dispatcher.ready(START_PATIENCE),
            bad::bad_input(&procs, &dispatcher.address)
        );
        bad::check_bad_input(&outcomes);
        outcomes
    };
    let mut cluster = ensemble(&[]);
    let (dispatcher, _proxy) = address(&mut cluster, Via::Proxy).await;
    let coord_outcomes = bad::bad_input(&procs, &dispatcher).await;
    bad::check_bad_input(&coord_outcomes);
    let codes = |o: &[(BadInput, Vec<CallOutcome>)]| {
        o.iter()
            .map(|(case, results)| {
                let r: Vec<Result<Vec<i64>, String>> = results
                    .iter()
                    .map(|r| r.clone().map_err(|e| e.code))
                    .collect();
                (*case, r)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(codes(&coord_outcomes), codes(&tf_outcomes));
    eprintln!("{test}: {:.1?} in all", started.elapsed());
}

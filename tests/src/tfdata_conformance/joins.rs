//! A worker joins running jobs: the round-robin consumers take its task in the same round (TF's
//! pending-task protocol), the plain job reads it too.

use std::time::Duration;

use super::modes::check_round_robin_pairs;
use super::{ADDED_WORKER_BOUND, READ_PATIENCE, START_PATIENCE};
use crate::tf_service::{DatasetKind, Mode, ReadResult, ReadSpec, Reader, Rewind, TfDataProcs};

/// What [`worker_added_mid_job`] saw.
pub struct AddedWorkerRun {
    /// The two consumers of the round-robin job, then the reader of the plain OFF job.
    results: Vec<ReadResult>,
    /// Each reader's first element of the added worker.
    rewinds: Vec<Rewind>,
    /// The added worker's ready report (seconds since the epoch).
    added_at: f64,
}

/// The scenario: one worker on `ports[0]`; a 2-consumer round-robin job and a plain OFF job, both
/// of an infinite increasing dataset; once they read, a second worker on `ports[1]` joins. Each
/// reader goes on until it has read 200 elements of the new worker's era.
pub async fn worker_added_mid_job(
    procs: &TfDataProcs,
    dispatcher: &str,
    ports: &[u16],
) -> AddedWorkerRun {
    let infinite = |consumers: Option<(u32, u32)>| ReadSpec {
        job_name: consumers.map(|_| "round-robin".to_string()),
        consumers,
        repeat: Some(-1),
        progress_every: 100,
        report_rewind: true,
        ..ReadSpec::new(DatasetKind::Range(1 << 40), Mode::Off)
    };
    let specs = [
        infinite(Some((2, 0))),
        infinite(Some((2, 1))),
        infinite(None),
    ];
    let prepared = procs.prepare_readers(&specs);
    let _first = procs.workers(dispatcher, &ports[..1], START_PATIENCE).await;
    let readers = prepared.go(dispatcher);
    for r in &readers {
        r.wait_progress(300, READ_PATIENCE).await;
    }
    let added = procs
        .start_worker(dispatcher, Some(ports[1]))
        .ready(START_PATIENCE)
        .await;
    let added_at = added.ready_wall();
    let mut rewinds = Vec::new();
    for r in &readers {
        rewinds.push(r.wait_rewind(READ_PATIENCE).await);
    }
    for (r, rewind) in readers.iter().zip(&rewinds) {
        r.wait_progress(rewind.index as u64 + 201, READ_PATIENCE)
            .await;
    }
    for r in &readers {
        r.stop();
    }
    let mut results = Vec::new();
    for r in &readers {
        results.push(finished(r).await);
    }
    AddedWorkerRun {
        results,
        rewinds,
        added_at,
    }
}

pub async fn finished(r: &Reader) -> ReadResult {
    r.finish(READ_PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", r.spec.label()))
}

/// Asserts what TF does when a worker joins running jobs: the round-robin consumers take the new
/// worker's task in the same round (TF's pending-task protocol) and from then on alternate
/// between the two workers' rounds, still pairing each round's elements; the plain job reads the
/// new worker too; both soon after it is up.
pub fn check_worker_added(run: &AddedWorkerRun) {
    let [c0, c1, plain] = &run.results[..] else {
        panic!("three readers expected")
    };
    let [r0, r1, rp] = &run.rewinds[..] else {
        panic!("three rewinds expected")
    };
    let after = |r: &Rewind| Duration::from_secs_f64((r.wall - run.added_at).max(0.0));
    eprintln!(
        "first element of the added worker: round-robin consumers at rounds {} and {}, {:.2?} \
         and {:.2?} after it was up; the plain job at element {}, {:.2?} after",
        r0.index,
        r1.index,
        after(r0),
        after(r1),
        rp.index,
        after(rp)
    );
    assert_eq!(
        r0.index, r1.index,
        "the consumers took the new worker in different rounds"
    );
    assert_eq!((r0.value, r1.value), (0, 1), "the new worker's first round");
    assert_eq!(rp.value, 0);
    let n = c0.elements.len().min(c1.elements.len());
    check_round_robin_pairs(&c0.elements[..n], &c1.elements[..n]);
    // After the switch, rounds alternate between the old worker's stream (above where it was)
    // and the new one's (from 0).
    let old = |v: i64| v > r0.highest;
    let tail = &c0.elements[r0.index..n.min(r0.index + 200)];
    for (k, w) in tail.windows(2).enumerate() {
        assert_ne!(
            old(w[0]),
            old(w[1]),
            "consumer 0 read from one worker in two rounds in a row ({} then {}, rounds {} and \
             {}): {tail:?}",
            w[0],
            w[1],
            r0.index + k,
            r0.index + k + 1
        );
    }
    assert!(plain.elements.len() > rp.index);
    for r in [r0, r1, rp] {
        assert!(
            after(r) < ADDED_WORKER_BOUND,
            "the added worker was read {:.2?} after it was up",
            after(r)
        );
    }
}

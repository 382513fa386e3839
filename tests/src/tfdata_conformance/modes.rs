//! Every processing mode: each mode on each dataset kind, two epochs, fewer files than workers,
//! and two round-robin consumers of one job, all at once.

use std::time::Instant;

use super::{times, Expect, Read, TestFiles, READ_PATIENCE, START_PATIENCE};
use crate::tf_service::{DatasetKind, Mode, ReadResult, ReadSpec, TfDataProcs};

/// The reads of [`every_mode`]: each mode on each dataset kind, SHARD_HINT with and without the
/// hint, two epochs under DYNAMIC and DATA, FILE and FILE_OR_DATA on fewer files than some
/// tests have workers, and two round-robin consumers of one job on an infinite dataset.
pub fn every_mode_specs(files: &TestFiles) -> Vec<ReadSpec> {
    let kinds = [
        DatasetKind::Range(20),
        DatasetKind::Slices(20),
        DatasetKind::Files(files.many.dir.clone()),
    ];
    let mut specs = Vec::new();
    for kind in &kinds {
        for mode in Mode::ALL {
            specs.push(ReadSpec::new(kind.clone(), mode));
        }
        specs.push(ReadSpec {
            shard_hint: true,
            ..ReadSpec::new(kind.clone(), Mode::Hint)
        });
    }
    specs.push(ReadSpec {
        repeat: Some(2),
        ..ReadSpec::new(DatasetKind::Range(20), Mode::Dynamic)
    });
    specs.push(ReadSpec {
        repeat: Some(2),
        ..ReadSpec::new(DatasetKind::Files(files.many.dir.clone()), Mode::Data)
    });
    for mode in [Mode::File, Mode::FileOrData] {
        specs.push(ReadSpec::new(
            DatasetKind::Files(files.few.dir.clone()),
            mode,
        ));
    }
    for index in 0..2 {
        specs.push(ReadSpec {
            job_name: Some("round-robin".into()),
            consumers: Some((2, index)),
            repeat: Some(-1),
            limit: Some(ROUND_ROBIN_ROUNDS),
            ..ReadSpec::new(DatasetKind::Range(1 << 40), Mode::Off)
        });
    }
    specs
}

/// Rounds each round-robin consumer of [`every_mode`] reads.
pub const ROUND_ROBIN_ROUNDS: u64 = 24;

/// The scenario: workers on `worker_ports` (the list `dispatcher` was configured with) pointed at
/// `dispatcher`, then every read of [`every_mode_specs`] at once, each its own job.
pub async fn every_mode(
    procs: &TfDataProcs,
    dispatcher: &str,
    worker_ports: &[u16],
    files: &TestFiles,
) -> Vec<Read> {
    let specs = every_mode_specs(files);
    // The readers import TF while the workers start.
    let prepared = procs.prepare_readers(&specs);
    let t = Instant::now();
    let _workers = procs
        .workers(dispatcher, worker_ports, START_PATIENCE)
        .await;
    eprintln!("{} workers up in {:.1?}", worker_ports.len(), t.elapsed());
    let t = Instant::now();
    let readers = prepared.go(dispatcher);
    let mut reads = Vec::new();
    for r in &readers {
        reads.push((r.spec.clone(), r.finish(READ_PATIENCE).await));
    }
    eprintln!("{} reads in {:.1?}", reads.len(), t.elapsed());
    for (spec, outcome) in &reads {
        match outcome {
            Ok(r) => eprintln!(
                "  {:<48} {:>3} elements in {:.2}s (first after {:.2}s){}",
                spec.label(),
                r.elements.len(),
                r.seconds,
                r.first_seconds.unwrap_or(f64::NAN),
                match spec.consumers {
                    Some(_) => format!(": {:?}", r.elements),
                    None => String::new(),
                }
            ),
            Err(e) => eprintln!("  {:<48} {}", spec.label(), e.brief()),
        }
    }
    reads
}

/// What TF guarantees for `spec` with `workers` workers.
pub fn expected(spec: &ReadSpec, workers: usize, files: &TestFiles) -> Expect {
    let epoch = files.epoch(&spec.dataset);
    let epochs = spec.repeat.map_or(1, |r| r as usize);
    let once = times(&epoch, epochs);
    let file_count = files.set(&spec.dataset).map(|s| s.files);
    let too_few_files = file_count.is_some_and(|f| f < workers);
    match spec.mode {
        Mode::Off => Expect::Multiset(times(&epoch, epochs * workers)),
        Mode::Dynamic | Mode::Data => Expect::Multiset(once),
        Mode::File | Mode::FileOrData if too_few_files => {
            Expect::Error("INVALID_ARGUMENT", "Could not apply FILE based sharding")
        }
        Mode::File if file_count.is_none() => {
            Expect::Error("NOT_FOUND", "Found an unshardable source dataset")
        }
        Mode::File | Mode::FileOrData => Expect::Multiset(once),
        Mode::Hint if spec.shard_hint => Expect::Multiset(once),
        // Without a SHARD_HINT there is nothing to shard: every worker produces everything.
        Mode::Hint => Expect::Multiset(times(&epoch, epochs * workers)),
    }
}

/// Asserts what TF guarantees of each read of [`every_mode`].
pub fn check_every_mode(reads: &[Read], workers: usize, files: &TestFiles) {
    let mut failures = Vec::new();
    for (spec, outcome) in reads.iter().filter(|(s, _)| s.consumers.is_none()) {
        let expect = expected(spec, workers, files);
        let ok = match (&expect, outcome) {
            (Expect::Multiset(want), Ok(got)) => got.sorted() == *want,
            (Expect::Error(code, text), Err(e)) => e.code == *code && e.message.contains(text),
            _ => false,
        };
        if !ok {
            let got = match outcome {
                Ok(r) => format!("{:?}", r.sorted()),
                Err(e) => e.to_string(),
            };
            failures.push(format!("{}: expected {expect:?}, got {got}", spec.label()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} reads with {workers} workers went wrong:\n{}",
        failures.len(),
        reads.len(),
        failures.join("\n")
    );
    let consumers: Vec<&ReadResult> = reads
        .iter()
        .filter(|(s, _)| s.consumers.is_some())
        .map(|(s, o)| match o {
            Ok(r) => r,
            Err(e) => panic!("{}: {e}", s.label()),
        })
        .collect();
    let [c0, c1] = consumers[..] else {
        panic!("two round-robin consumers expected")
    };
    check_round_robin_pairs(&c0.elements, &c1.elements);
    assert_eq!(c0.elements.len() as u64, ROUND_ROBIN_ROUNDS);
    assert_eq!(c1.elements.len() as u64, ROUND_ROBIN_ROUNDS);
}

/// Both consumers of a 2-consumer job read each round from the same worker, which hands the
/// round's two consecutive elements of its stream to consumers 0 and 1.
pub fn check_round_robin_pairs(c0: &[i64], c1: &[i64]) {
    for (round, (a, b)) in c0.iter().zip(c1).enumerate() {
        assert_eq!(
            *b,
            a + 1,
            "round {round}: consumer 0 read {a}, consumer 1 read {b}; consumer 0 read {c0:?}, \
             consumer 1 read {c1:?}"
        );
    }
}

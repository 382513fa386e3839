//! States and logs of before the two dispatchers became one: coord's updates replayed from an
//! old log give its objects the ids that dispatcher gave them, and an old snapshot's two states
//! convert into one that serves every dataset, job and split position they held.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;

use super::*;
use crate::dispatcher::legacy::{convert, coord as old, tf as old_tf};

fn replay(s: &mut DispatcherState, o: old::DispatchOp) -> DispatcherOutput {
    let before = s.clone();
    match s.apply_legacy(&o, 7) {
        Ok(out) => out,
        Err(e) => {
            assert_eq!(*s, before, "a refused {o} changed the state");
            panic!("{o}: {e:?}")
        }
    }
}

/// The log of a build of before: dataset 1, worker 2, job 3 with task 4 and client 5, and so on
/// from one shared counter.
fn old_log() -> Vec<old::DispatchOp> {
    vec![
        old::DispatchOp::RegisterDataset {
            fingerprint: 9,
            def: Bytes::from_static(b"def"),
            total_splits: Some(10),
        },
        old::DispatchOp::RegisterWorker {
            address: "w:1".into(),
            rounds: BTreeMap::new(),
        },
        old::DispatchOp::GetOrCreateJob {
            dataset: 1,
            mode: old::Mode::Dynamic,
            name: Some("train".into()),
            num_consumers: None,
        },
        old::DispatchOp::GetSplit {
            task: 4,
            done: vec![],
            max: 3,
        },
    ]
}

#[test]
fn an_old_log_replays_with_the_ids_it_gave() {
    let mut s = DispatcherState::default();
    let outs: Vec<DispatcherOutput> = old_log().into_iter().map(|o| replay(&mut s, o)).collect();
    assert_eq!(
        outs,
        vec![
            DispatcherOutput::Definition {
                id: "1".into(),
                created: true
            },
            DispatcherOutput::Registered(2),
            DispatcherOutput::Iteration {
                client: 5,
                iteration: 3,
                new_tasks: vec![],
            },
            DispatcherOutput::Lease(LeaseAnswer::Splits(vec![0, 1, 2])),
        ]
    );
    assert_eq!(s.iterations[&3].tasks, vec![4]);
    assert_eq!(s.legacy.as_ref().map(|l| l.last_id), Some(5));
    // Today's updates number on from TensorFlow's bases, and a registration after the old ones.
    match ok_op(
        &mut s,
        DispatcherOp::ClientTimeout {
            client: 5,
            time_micros: 1,
        },
    ) {
        DispatcherOutput::Done => {}
        o => panic!("{o:?}"),
    }
    let d = match ok_op(
        &mut s,
        DispatcherOp::RegisterDefinition {
            fingerprint: 10,
            def: Bytes::new(),
            total_splits: None,
        },
    ) {
        DispatcherOutput::Definition { id, .. } => id,
        o => panic!("{o:?}"),
    };
    assert_eq!(d, "1000");
    match ok_op(
        &mut s,
        DispatcherOp::RegisterDataWorker {
            address: "w:2".into(),
            rounds: BTreeMap::new(),
        },
    ) {
        DispatcherOutput::Registered(r) => assert!(r > 2, "{r}"),
        o => panic!("{o:?}"),
    }
}

fn ok_op(s: &mut DispatcherState, o: DispatcherOp) -> DispatcherOutput {
    op(s, o).expect("applies")
}

/// The coord dispatcher state the old log above leaves, as that build kept it.
fn old_state() -> old::DispatcherState {
    let mut s = old::DispatcherState::default();
    s.datasets.insert(
        1,
        old::Dataset {
            fingerprint: 9,
            def: Bytes::from_static(b"def"),
            total_splits: Some(10),
        },
    );
    s.by_fingerprint.insert(9, 1);
    s.workers
        .insert("w:1".into(), old::Worker { id: 2, alive: true });
    s.jobs.insert(
        3,
        old::Job {
            id: 3,
            name: Some("train".into()),
            dataset: 1,
            mode: old::Mode::Dynamic,
            num_consumers: None,
            num_shards: 1,
            tasks: vec![4],
            clients: BTreeSet::from([5]),
            idle_since_ms: None,
            finished: false,
            garbage_collected: false,
            splits: old::SplitProvider {
                next: 3,
                total: Some(10),
                leased: BTreeMap::from([(0, 4), (1, 4), (2, 4)]),
                reissue: BTreeSet::new(),
                delivered: 0,
                reissued: 0,
            },
            pending: VecDeque::new(),
        },
    );
    s.named_jobs.insert("train".into(), 3);
    s.tasks.insert(
        4,
        old::Task {
            id: 4,
            job: 3,
            worker: "w:1".into(),
            worker_id: 2,
            shard_index: 0,
            starting_round: Some(0),
            finished: false,
            removed: false,
        },
    );
    s.clients.insert(5, 3);
    s.last_id = 5;
    s.updates = 4;
    s
}

#[test]
fn an_old_snapshot_converts_to_the_state_its_log_replays_to() {
    let mut replayed = DispatcherState::default();
    for o in old_log() {
        replay(&mut replayed, o);
    }
    let converted = convert(old_state(), old_tf::TfDataState::default());
    // The same records, whichever way they came (the TF job behind coord's job has an id of
    // TensorFlow's either way).
    assert_eq!(converted.datasets, replayed.datasets);
    assert_eq!(converted.by_fingerprint, replayed.by_fingerprint);
    assert_eq!(converted.workers, replayed.workers);
    assert_eq!(converted.jobs, replayed.jobs);
    assert_eq!(converted.iterations, replayed.iterations);
    assert_eq!(converted.tasks, replayed.tasks);
    assert_eq!(converted.clients, replayed.clients);
    assert_eq!(converted.splits_handed_out, 3);
    assert_eq!(converted.updates, 4);
    // And it goes on where it stood: split 3 next, leases delivered, the job finished.
    let mut s = converted;
    match op(
        &mut s,
        DispatcherOp::LeaseSplits {
            task: 4,
            done: vec![0, 1, 2],
            max: 100,
        },
    ) {
        Ok(DispatcherOutput::Lease(LeaseAnswer::Splits(splits))) => {
            assert_eq!(splits, (3..10).collect::<Vec<_>>())
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn ids_both_dispatchers_held_are_remapped_and_the_old_log_follows() {
    let mut tf = old_tf::TfDataState::default();
    // A TensorFlow client chose dataset id "1"; TensorFlow named a job "train" too.
    tf.datasets.insert(
        "1".into(),
        old_tf::Dataset {
            def: Bytes::from_static(b"graph"),
            metadata: Bytes::new(),
            compression: 0,
            compression_disabled: None,
        },
    );
    tf.jobs.insert(
        5000,
        old_tf::Job {
            id: 5000,
            name: "train".into(),
            dataset: "1".into(),
            sharding: sharding::OFF,
            num_consumers: None,
            target_workers: 0,
            cross_trainer_cache: false,
        },
    );
    tf.jobs_by_name.insert("train".into(), 5000);
    tf.next.job = 5001;
    let mut s = convert(old_state(), tf);
    let moved = s.legacy.as_ref().and_then(|l| l.remap.get(&1)).copied();
    assert_eq!(moved, Some(1000), "coord's dataset 1 moved to a fresh id");
    assert!(matches!(s.datasets["1"].source, DatasetSource::Graph(_)));
    assert!(s.datasets["1000"].source.is_definition());
    assert_eq!(s.by_fingerprint[&9], "1000");
    let coord_job = &s.jobs[&s.iterations[&3].job];
    assert_eq!(coord_job.dataset, "1000");
    assert_eq!(coord_job.name, "train (coord job 3)");
    // An update of the old log naming dataset 1 means coord's dataset, wherever it went.
    match replay(
        &mut s,
        old::DispatchOp::GetOrCreateJob {
            dataset: 1,
            mode: old::Mode::Off,
            name: None,
            num_consumers: None,
        },
    ) {
        DispatcherOutput::Iteration {
            iteration, client, ..
        } => {
            assert_eq!(
                (iteration, client),
                (6, 8),
                "ids 6 (job), 7 (task), 8 (client)"
            );
            let job = &s.jobs[&s.iterations[&6].job];
            assert_eq!(job.dataset, "1000");
        }
        o => panic!("{o:?}"),
    }
}

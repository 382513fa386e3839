use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::*;

fn ok(s: &mut DispatcherState, op: DispatchOp) -> DispatchOutput {
    match s.apply(&op, 1_000) {
        Ok(o) => o,
        other => panic!("{op} gave {other:?}"),
    }
}

fn refused(s: &mut DispatcherState, op: DispatchOp) -> (Code, String) {
    let before = s.clone();
    match s.apply(&op, 1_000) {
        Err(OpError::Status { code, message }) => {
            assert_eq!(*s, before, "{op} was refused but changed the state");
            (code, message)
        }
        other => panic!("{op} should be refused, gave {other:?}"),
    }
}

fn dataset(s: &mut DispatcherState, fingerprint: u64, total: Option<u64>) -> u64 {
    match ok(
        s,
        DispatchOp::RegisterDataset {
            fingerprint,
            def: Bytes::from_static(b"def"),
            total_splits: total,
        },
    ) {
        DispatchOutput::Dataset { id, .. } => id,
        o => panic!("{o:?}"),
    }
}

fn worker(s: &mut DispatcherState, address: &str) -> u64 {
    match ok(
        s,
        DispatchOp::RegisterWorker {
            address: address.into(),
            rounds: BTreeMap::new(),
        },
    ) {
        DispatchOutput::Worker { id } => id,
        o => panic!("{o:?}"),
    }
}

fn job(s: &mut DispatcherState, dataset: u64, mode: Mode, name: Option<&str>) -> (u64, u64) {
    match ok(
        s,
        DispatchOp::GetOrCreateJob {
            dataset,
            mode,
            name: name.map(str::to_string),
            num_consumers: None,
        },
    ) {
        DispatchOutput::Job { job, client } => (job, client),
        o => panic!("{o:?}"),
    }
}

fn split(s: &mut DispatcherState, task: u64, done: Vec<u64>) -> SplitAnswer {
    match ok(s, DispatchOp::GetSplit { task, done, max: 1 }) {
        DispatchOutput::Split(a) => a,
        o => panic!("{o:?}"),
    }
}

#[test]
fn datasets_dedupe_by_fingerprint() {
    let mut s = DispatcherState::default();
    let a = dataset(&mut s, 7, Some(3));
    let b = dataset(&mut s, 7, Some(3));
    let c = dataset(&mut s, 8, Some(3));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn a_named_job_must_match() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    let other = dataset(&mut s, 2, Some(10));
    worker(&mut s, "w1");
    let (j1, c1) = job(&mut s, d, Mode::Dynamic, Some("train"));
    let (j2, c2) = job(&mut s, d, Mode::Dynamic, Some("train"));
    assert_eq!(j1, j2);
    assert_ne!(c1, c2);
    let (code, msg) = refused(
        &mut s,
        DispatchOp::GetOrCreateJob {
            dataset: other,
            mode: Mode::Off,
            name: Some("train".into()),
            num_consumers: None,
        },
    );
    assert_eq!(code, Code::InvalidArgument);
    assert!(
        msg.contains("\"train\"") && msg.contains("dataset") && msg.contains("Dynamic"),
        "{msg}"
    );
    let (code, msg) = refused(
        &mut s,
        DispatchOp::GetOrCreateJob {
            dataset: 999,
            mode: Mode::Off,
            name: None,
            num_consumers: None,
        },
    );
    assert_eq!((code, msg.contains("dataset 999")), (Code::NotFound, true));
}

#[test]
fn splits_are_handed_out_once_and_dead_workers_leases_come_back() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(5));
    worker(&mut s, "w1");
    let w2 = worker(&mut s, "w2");
    let (j, _) = job(&mut s, d, Mode::Dynamic, None);
    let tasks = s.jobs[&j].tasks.clone();
    let (t1, t2) = (tasks[0], tasks[1]);
    let mut given = Vec::new();
    for t in [t1, t2, t1, t2] {
        if let SplitAnswer::Splits(x) = split(&mut s, t, vec![]) {
            let x = x[0];
            given.push((t, x));
        }
    }
    assert_eq!(
        given.iter().map(|g| g.1).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    // t1 delivered its splits; w2 dies holding 1 and 3.
    assert_eq!(split(&mut s, t1, vec![0, 2]), SplitAnswer::Splits(vec![4]));
    ok(
        &mut s,
        DispatchOp::WorkerTimeout {
            address: "w2".into(),
            worker_id: w2,
        },
    );
    let (code, _) = refused(
        &mut s,
        DispatchOp::GetSplit {
            task: t2,
            done: vec![],
            max: 1,
        },
    );
    assert_eq!(code, Code::FailedPrecondition);
    assert_eq!(split(&mut s, t1, vec![4]), SplitAnswer::Splits(vec![1]));
    assert_eq!(split(&mut s, t1, vec![1]), SplitAnswer::Splits(vec![3]));
    assert_eq!(split(&mut s, t1, vec![]), SplitAnswer::EndOfSplits);
    assert!(!s.jobs[&j].finished, "split 3 is not delivered yet");
    ok(
        &mut s,
        DispatchOp::WorkerUpdate {
            address: "w1".into(),
            done: vec![(t1, 3)],
            completed: vec![t1],
        },
    );
    assert!(s.jobs[&j].finished);
    assert_eq!(s.jobs[&j].splits.delivered, 5);
    assert_eq!(s.jobs[&j].splits.reissued, 2);
}

#[test]
fn a_task_waits_while_others_hold_leases() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(1));
    worker(&mut s, "a");
    worker(&mut s, "b");
    let (j, _) = job(&mut s, d, Mode::Dynamic, None);
    let t = s.jobs[&j].tasks.clone();
    assert_eq!(split(&mut s, t[0], vec![]), SplitAnswer::Splits(vec![0]));
    assert_eq!(split(&mut s, t[1], vec![]), SplitAnswer::Retry);
    assert_eq!(split(&mut s, t[0], vec![0]), SplitAnswer::EndOfSplits);
    assert_eq!(split(&mut s, t[1], vec![]), SplitAnswer::EndOfSplits);
}

#[test]
fn a_worker_joining_gets_a_task_for_every_unfinished_job() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    let (j1, _) = job(&mut s, d, Mode::Dynamic, None);
    let (j2, _) = job(&mut s, d, Mode::Off, None);
    assert!(s.jobs[&j1].tasks.is_empty());
    worker(&mut s, "late");
    assert_eq!(s.jobs[&j1].tasks.len(), 1);
    assert_eq!(s.jobs[&j2].tasks.len(), 1);
    // Registering again while alive changes nothing.
    let before = s.tasks.len();
    worker(&mut s, "late");
    assert_eq!(s.tasks.len(), before);
}

#[test]
fn static_sharding_needs_workers() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    let (code, msg) = refused(
        &mut s,
        DispatchOp::GetOrCreateJob {
            dataset: d,
            mode: Mode::File,
            name: None,
            num_consumers: None,
        },
    );
    assert_eq!(code, Code::FailedPrecondition, "{msg}");
    worker(&mut s, "a");
    worker(&mut s, "b");
    let (j, _) = job(&mut s, d, Mode::Data, None);
    let shards: BTreeSet<u64> = s.jobs[&j]
        .tasks
        .iter()
        .map(|t| s.tasks[t].shard_index)
        .collect();
    assert_eq!(shards, BTreeSet::from([0, 1]));
    assert_eq!(s.jobs[&j].num_shards, 2);
}

#[test]
fn round_robin_needs_off_and_an_infinite_dataset() {
    let mut s = DispatcherState::default();
    let finite = dataset(&mut s, 1, Some(10));
    let infinite = dataset(&mut s, 2, None);
    for (dataset, mode, want) in [
        (finite, Mode::Off, "infinite"),
        (infinite, Mode::Dynamic, "OFF"),
    ] {
        let (code, msg) = refused(
            &mut s,
            DispatchOp::GetOrCreateJob {
                dataset,
                mode,
                name: None,
                num_consumers: Some(2),
            },
        );
        assert_eq!(code, Code::InvalidArgument);
        assert!(msg.contains(want), "{msg}");
    }
}

/// The example in the comments of TensorFlow's tf.data dispatcher (`DataServiceDispatcherImpl`),
/// step by step.
#[test]
fn pending_task_protocol_follows_tensorflows_example() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, None);
    worker(&mut s, "w1");
    let rr = |s: &mut DispatcherState| match ok(
        s,
        DispatchOp::GetOrCreateJob {
            dataset: d,
            mode: Mode::Off,
            name: Some("rr".into()),
            num_consumers: Some(2),
        },
    ) {
        DispatchOutput::Job { job, client } => (job, client),
        o => panic!("{o:?}"),
    };
    let (j, c1) = rr(&mut s);
    let (_, c2) = rr(&mut s);
    let beat = |s: &mut DispatcherState, client, current, blocked| match ok(
        s,
        DispatchOp::ClientRounds {
            client,
            current_round: Some(current),
            blocked_round: blocked,
        },
    ) {
        DispatchOutput::Block(b) => b,
        o => panic!("{o:?}"),
    };
    // 1-2. Consumers at round 50; a worker joins: target 51.
    ok(
        &mut s,
        DispatchOp::RegisterWorker {
            address: "w2".into(),
            rounds: BTreeMap::from([(j, 50)]),
        },
    );
    let new_task = *s.jobs[&j].tasks.last().unwrap();
    assert_eq!(
        s.visible_tasks(&s.jobs[&j]).count(),
        1,
        "pending tasks are not shown"
    );
    assert_eq!(beat(&mut s, c1, 50, None), Some(51)); // 3
    assert_eq!(beat(&mut s, c2, 51, None), Some(53)); // 4: too late for 51
    assert_eq!(beat(&mut s, c1, 50, Some(51)), Some(53)); // 5: ready for 53
    assert_eq!(beat(&mut s, c2, 52, Some(53)), None); // 6: promoted
    assert_eq!(s.tasks[&new_task].starting_round, Some(53));
    assert_eq!(s.visible_tasks(&s.jobs[&j]).count(), 2);
    assert_eq!(beat(&mut s, c1, 50, Some(53)), None); // 7
}

#[test]
fn unknown_ids_are_named() {
    let mut s = DispatcherState::default();
    for (op, want) in [
        (
            DispatchOp::GetSplit {
                task: 42,
                done: vec![],
                max: 1,
            },
            "task 42",
        ),
        (DispatchOp::ReleaseClient { client: 43 }, "job client 43"),
        (DispatchOp::CollectJob { job: 44 }, "job 44"),
        (
            DispatchOp::WorkerUpdate {
                address: "nowhere:1".into(),
                done: vec![],
                completed: vec![],
            },
            "nowhere:1",
        ),
    ] {
        let (code, msg) = refused(&mut s, op);
        assert_eq!(code, Code::NotFound);
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn a_collected_job_removes_its_tasks() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    worker(&mut s, "w");
    let (j, c) = job(&mut s, d, Mode::Off, Some("n"));
    let (code, _) = refused(&mut s, DispatchOp::CollectJob { job: j });
    assert_eq!(code, Code::FailedPrecondition, "it has a client");
    ok(&mut s, DispatchOp::ReleaseClient { client: c });
    assert_eq!(s.jobs[&j].idle_since_ms, Some(1_000));
    ok(&mut s, DispatchOp::CollectJob { job: j });
    assert!(s.visible_tasks(&s.jobs[&j]).next().is_none());
    let (code, msg) = refused(
        &mut s,
        DispatchOp::GetOrCreateJob {
            dataset: d,
            mode: Mode::Off,
            name: Some("n".into()),
            num_consumers: None,
        },
    );
    assert_eq!(code, Code::FailedPrecondition);
    assert!(msg.contains("garbage-collected"), "{msg}");
}

#[test]
fn a_lease_takes_reissued_splits_first_and_stops_at_the_end() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    worker(&mut s, "a");
    let wb = worker(&mut s, "b");
    let (j, _) = job(&mut s, d, Mode::Dynamic, None);
    let t = s.jobs[&j].tasks.clone();
    let lease = |s: &mut DispatcherState, task, max| match ok(
        s,
        DispatchOp::GetSplit {
            task,
            done: vec![],
            max,
        },
    ) {
        DispatchOutput::Split(a) => a,
        o => panic!("{o:?}"),
    };
    assert_eq!(
        lease(&mut s, t[1], 4),
        SplitAnswer::Splits(vec![0, 1, 2, 3])
    );
    ok(
        &mut s,
        DispatchOp::WorkerTimeout {
            address: "b".into(),
            worker_id: wb,
        },
    );
    assert_eq!(
        lease(&mut s, t[0], 8),
        SplitAnswer::Splits(vec![0, 1, 2, 3, 4, 5, 6, 7])
    );
    assert_eq!(lease(&mut s, t[0], 8), SplitAnswer::Splits(vec![8, 9]));
    assert_eq!(s.jobs[&j].splits.reissued, 4);
}

/// Random updates over a small id space (so they hit existing and missing ids alike): apply never
/// panics, and a refused update leaves the state exactly as it was.
#[test]
fn fuzz_updates_never_panic_and_refusals_change_nothing() {
    let mut next = coord_proto::fuzz::xorshift(0x2545_F491_4F6C_DD1D);
    let mut s = DispatcherState::default();
    let (mut applied, mut refused) = (0, 0);
    for step in 0..30_000u64 {
        let id = next() % 40;
        let addr = format!("w{}", next() % 4);
        let mode = [Mode::Off, Mode::Dynamic, Mode::File, Mode::Data][(next() % 4) as usize];
        let op = match next() % 11 {
            0 => DispatchOp::RegisterDataset {
                fingerprint: next() % 5,
                def: Bytes::from_static(b"d"),
                total_splits: [None, Some(0), Some(next() % 50)][(next() % 3) as usize],
            },
            1 => DispatchOp::GetOrCreateJob {
                dataset: id,
                mode,
                name: next().is_multiple_of(2).then(|| format!("j{}", next() % 3)),
                num_consumers: [None, Some(0), Some(1 + next() % 3)][(next() % 3) as usize],
            },
            2 => DispatchOp::ReleaseClient { client: id },
            3 => DispatchOp::ClientTimeout { client: id },
            4 => DispatchOp::RegisterWorker {
                address: addr,
                rounds: BTreeMap::from([(id, (next() % 100) as i64)]),
            },
            5 => DispatchOp::WorkerTimeout {
                address: addr,
                worker_id: id,
            },
            6 | 7 => DispatchOp::GetSplit {
                task: id,
                done: (0..next() % 3).map(|_| next() % 50).collect(),
                max: (next() % 10) as u32,
            },
            8 => DispatchOp::WorkerUpdate {
                address: addr,
                done: (0..next() % 3)
                    .map(|_| (next() % 40, next() % 50))
                    .collect(),
                completed: (0..next() % 2).map(|_| next() % 40).collect(),
            },
            9 => DispatchOp::ClientRounds {
                client: id,
                current_round: Some((next() % 200) as i64 - 50),
                blocked_round: next().is_multiple_of(2).then(|| (next() % 200) as i64),
            },
            _ => DispatchOp::CollectJob { job: id },
        };
        let before = s.clone();
        match s.apply(&op, step) {
            Ok(_) => applied += 1,
            Err(_) => {
                assert_eq!(s, before, "step {step}: refused {op} changed the state");
                refused += 1;
            }
        }
        // Invariants: a leased split is below the provider's position; leases point at tasks
        // of their own job.
        for j in s.jobs.values() {
            for (split, task) in &j.splits.leased {
                assert!(
                    *split < j.splits.next,
                    "step {step}: leased split {split} never handed out"
                );
                assert_eq!(s.tasks.get(task).map(|t| t.job), Some(j.id), "step {step}");
            }
        }
    }
    assert!(
        applied > 5_000 && refused > 5_000,
        "{applied} applied, {refused} refused"
    );
}

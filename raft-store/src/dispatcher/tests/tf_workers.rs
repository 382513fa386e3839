//! TensorFlow's RPCs: round-robin reads, task removal, collection, compression, lost workers.

use bytes::Bytes;

use super::*;

#[test]
fn a_worker_joining_a_round_robin_read_waits_for_every_consumer() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    job_with(&mut s, "1000", sharding::OFF, Some("rr"), Some(2)).expect("job");
    let (c1, it, _) = iteration(&mut s, 5000, 1, 0);
    let (c2, _, _) = iteration(&mut s, 5000, 1, 0);
    // Consumers are at round 7: the new worker's task aims at round 8.
    worker(&mut s, "b:1", &[(it, 7)]);
    let pending = s.iterations[&it].pending.front().cloned().expect("pending");
    assert_eq!(pending.target_round, 8);
    assert_eq!(s.iterations[&it].tasks.len(), 1, "not readable yet");
    let hb = |s: &mut DispatcherState, client, current, blocked, client_round| {
        op(
            s,
            DispatcherOp::ClientHeartbeat {
                client,
                current_round: Some(current),
                blocked_round: blocked,
                client_round,
            },
        )
        .expect("heartbeat")
    };
    // Consumer 1 already reads round 9: rejected, aimed at 9 + 2.
    hb(&mut s, c1, 9, None, 9);
    let p = s.iterations[&it].pending.front().cloned().expect("pending");
    assert_eq!((p.target_round, p.failures), (11, 1));
    // Consumer 2 blocked before 11 and accepts; consumer 1 too: the task is readable from 11.
    hb(&mut s, c2, 10, Some(11), 10);
    assert_eq!(s.iterations[&it].pending.len(), 1);
    hb(&mut s, c1, 10, Some(10), 10);
    assert!(s.iterations[&it].pending.is_empty());
    assert_eq!(s.iterations[&it].tasks.len(), 2);
    let promoted = s.iterations[&it].tasks[1];
    assert_eq!(s.tasks[&promoted].starting_round, 11);
    // A second rejection doubles the distance.
    worker(&mut s, "c:1", &[(it, 20)]);
    hb(&mut s, c1, 21, None, 21);
    hb(&mut s, c1, 23, None, 23);
    let p = s.iterations[&it].pending.front().cloned().expect("pending");
    assert_eq!((p.target_round, p.failures), (27, 2));
}

#[test]
fn a_removed_round_robin_task_is_forgotten_and_its_worker_gets_a_new_one() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    worker(&mut s, "b:1", &[]);
    job_with(&mut s, "1000", sharding::OFF, Some("rr"), Some(1)).expect("job");
    let (_, it, tasks) = iteration(&mut s, 5000, 1, 0);
    op(&mut s, DispatcherOp::RemoveTask { task: tasks[0] }).expect("remove");
    assert!(!s.tasks.contains_key(&tasks[0]));
    assert_eq!(s.iterations[&it].tasks, vec![tasks[1]]);
    // Removing it again is not an error (TF answers removed).
    op(&mut s, DispatcherOp::RemoveTask { task: tasks[0] }).expect("remove again");
    assert_eq!(s.round_robin_iterations_without("a:1"), vec![it]);
    worker(&mut s, "a:1", &[(it, 4)]);
    assert_eq!(s.iterations[&it].pending.len(), 1);
    assert_eq!(s.iterations[&it].pending[0].target_round, 5);
    // Only round-robin tasks can be removed.
    job(&mut s, "1000", sharding::OFF, None).expect("job");
    let (_, _, plain) = iteration(&mut s, 5001, 1, 0);
    let r = op(&mut s, DispatcherOp::RemoveTask { task: plain[0] });
    assert_eq!(code(r), Code::FailedPrecondition);
}

#[test]
fn an_idle_iteration_is_collected_and_its_key_gets_a_new_iteration() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    job(&mut s, "1000", sharding::OFF, Some("j")).expect("job");
    let (c, it, tasks) = iteration(&mut s, 5000, 1, 0);
    let gc = DispatcherOp::GarbageCollectIteration { iteration: it };
    assert_eq!(code(op(&mut s, gc.clone())), Code::FailedPrecondition);
    op(
        &mut s,
        DispatcherOp::ReleaseClient {
            client: c,
            time_micros: 55,
        },
    )
    .expect("release");
    assert_eq!(s.iterations[&it].last_client_released_micros, 55);
    let again = DispatcherOp::ReleaseClient {
        client: c,
        time_micros: 56,
    };
    assert_eq!(
        message(op(&mut s, again)),
        format!("Iteration client id not found: {c}")
    );
    op(&mut s, gc).expect("collect");
    assert!(s.iterations[&it].garbage_collected);
    assert!(s.tasks[&tasks[0]].finished);
    let (_, it2, _) = iteration(&mut s, 5000, 1, 0);
    assert_ne!(it2, it);
}

#[test]
fn compression_is_decided_once() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    let ask = |s: &mut DispatcherState, disable| {
        op(
            s,
            DispatcherOp::DisableCompression {
                dataset: "1000".into(),
                disable,
            },
        )
    };
    assert_eq!(
        ask(&mut s, false),
        Ok(DispatcherOutput::Compression(Some(false)))
    );
    assert_eq!(
        ask(&mut s, true),
        Ok(DispatcherOutput::Compression(Some(false)))
    );
    op(
        &mut s,
        DispatcherOp::RegisterDataset {
            requested_id: None,
            def: Bytes::new(),
            metadata: Bytes::new(),
            compression: 1,
        },
    )
    .expect("uncompressed");
    let r = op(
        &mut s,
        DispatcherOp::DisableCompression {
            dataset: "1001".into(),
            disable: true,
        },
    );
    assert_eq!(r, Ok(DispatcherOutput::Compression(None)));
    let r = op(
        &mut s,
        DispatcherOp::DisableCompression {
            dataset: "x".into(),
            disable: true,
        },
    );
    assert_eq!(message(r), "Dataset id x not found");
}

#[test]
fn the_state_survives_the_snapshot_codec() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    job_with(&mut s, "1000", sharding::DYNAMIC, Some("j"), None).expect("job");
    let (_, it, _) = iteration(&mut s, 5000, 1, 4);
    split(&mut s, it, 0);
    let bytes = crate::codec::encode("tfdata", &s).expect("encode");
    let back: DispatcherState = crate::codec::decode("tfdata", &bytes).expect("decode");
    assert_eq!(back, s);
}

#[test]
fn a_lost_worker_gets_no_new_tasks_until_it_is_back() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    worker(&mut s, "b:1", &[]);
    op(
        &mut s,
        DispatcherOp::WorkerLost {
            address: "b:1".into(),
        },
    )
    .expect("lost");
    let r = op(
        &mut s,
        DispatcherOp::WorkerLost {
            address: "c:1".into(),
        },
    );
    assert_eq!(code(r), Code::NotFound);
    job(&mut s, "1000", sharding::OFF, None).expect("job");
    let (_, it, tasks) = iteration(&mut s, 5000, 1, 0);
    assert_eq!(tasks.len(), 1, "no task on the lost worker");
    assert_eq!(s.tasks[&tasks[0]].worker, "a:1");
    // Back: it gets a task of the iteration made while it was away, and only one.
    worker(&mut s, "b:1", &[]);
    assert!(!s.workers["b:1"].lost);
    assert_eq!(s.iterations[&it].tasks.len(), 2);
    worker(&mut s, "b:1", &[]);
    assert_eq!(s.iterations[&it].tasks.len(), 2);
    // Lost again after finishing its task: back, it does not run the iteration a second time.
    let b_task = s.iterations[&it].tasks[1];
    op(
        &mut s,
        DispatcherOp::FinishTasks {
            address: "b:1".into(),
            tasks: vec![b_task],
        },
    )
    .expect("finish");
    op(
        &mut s,
        DispatcherOp::WorkerLost {
            address: "b:1".into(),
        },
    )
    .expect("lost");
    worker(&mut s, "b:1", &[]);
    assert_eq!(s.iterations[&it].tasks.len(), 2);
    assert!(s.workers["b:1"].tasks.is_empty());
}

#[test]
fn a_lease_takes_several_splits_of_one_repetition() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    job(&mut s, "1000", sharding::DYNAMIC, None).expect("job");
    let (_, it, _) = iteration(&mut s, 5000, 1, 10);
    let lease = |s: &mut DispatcherState, repetition, max| {
        op(
            s,
            DispatcherOp::GetSplit {
                iteration: it,
                repetition,
                provider: 0,
                max,
            },
        )
        .expect("splits")
    };
    assert_eq!(
        lease(&mut s, 0, 8),
        DispatcherOutput::Splits { from: 0, count: 8 }
    );
    // The rest of the repetition, never past it.
    assert_eq!(
        lease(&mut s, 0, 8),
        DispatcherOutput::Splits { from: 8, count: 2 }
    );
    assert_eq!(
        lease(&mut s, 0, 8),
        DispatcherOutput::Splits { from: 0, count: 0 }
    );
    assert_eq!(s.splits_handed_out, 10);
    // max 0 is one split.
    assert_eq!(
        lease(&mut s, 1, 0),
        DispatcherOutput::Splits { from: 0, count: 1 }
    );
}

//! TensorFlow's dispatcher state as pure functions: no sockets, no runtime.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::*;
use crate::command::{Command, Op, Output, Proposal};
use crate::error::RequestId;
use crate::state::CoordState;

fn op(s: &mut TfDataState, op: TfDataOp) -> TfDataResult {
    let before = s.clone();
    let out = s.apply(&op);
    if out.is_err() {
        assert_eq!(*s, before, "a refused {op} changed the state");
    }
    out
}

fn register(s: &mut TfDataState, id: Option<&str>, metadata: &str) -> TfDataResult {
    op(
        s,
        TfDataOp::RegisterDataset {
            requested_id: id.map(str::to_string),
            def: Bytes::from_static(b"graph"),
            metadata: Bytes::from(metadata.to_string()),
            compression: COMPRESSION_SNAPPY,
        },
    )
}

fn job(s: &mut TfDataState, dataset: &str, sharding: i32, name: Option<&str>) -> TfDataResult {
    job_with(s, dataset, sharding, name, None)
}

fn job_with(
    s: &mut TfDataState,
    dataset: &str,
    sharding: i32,
    name: Option<&str>,
    num_consumers: Option<i64>,
) -> TfDataResult {
    op(
        s,
        TfDataOp::GetOrCreateJob {
            dataset: dataset.into(),
            sharding,
            name: name.map(str::to_string),
            anonymous_tag: 77,
            num_consumers,
            target_workers: 1,
            cross_trainer_cache: false,
        },
    )
}

fn splits(n: u64) -> Vec<ProviderSpec> {
    vec![ProviderSpec {
        spec: Bytes::from_static(b"range"),
        splits: n,
    }]
}

fn iteration(s: &mut TfDataState, job: i64, repetition: i64, n: u64) -> (i64, i64, Vec<i64>) {
    match op(
        s,
        TfDataOp::GetOrCreateIteration {
            job,
            repetition,
            providers: splits(n),
        },
    ) {
        Ok(TfDataOutput::Iteration {
            client,
            iteration,
            new_tasks,
        }) => (client, iteration, new_tasks),
        other => panic!("iteration: {other:?}"),
    }
}

fn worker(s: &mut TfDataState, address: &str, rounds: &[(i64, i64)]) {
    let out = op(
        s,
        TfDataOp::WorkerHeartbeat {
            address: address.into(),
            transfer_servers: vec![Bytes::from_static(b"grpc")],
            tags: vec![],
            uid: -1,
            index: None,
            rounds: rounds.iter().copied().collect::<BTreeMap<_, _>>(),
        },
    );
    assert_eq!(out, Ok(TfDataOutput::Done));
}

fn split(s: &mut TfDataState, iteration: i64, repetition: i64) -> Option<u64> {
    match op(
        s,
        TfDataOp::GetSplit {
            iteration,
            repetition,
            provider: 0,
            max: 1,
        },
    ) {
        Ok(TfDataOutput::Splits { count: 0, .. }) => None,
        Ok(TfDataOutput::Splits { from, count: 1 }) => Some(from),
        other => panic!("split: {other:?}"),
    }
}

fn code(r: TfDataResult) -> Code {
    match r {
        Err(OpError::Status { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn message(r: TfDataResult) -> String {
    match r {
        Err(OpError::Status { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn datasets_get_tensorflows_ids_and_a_chosen_id_must_match() {
    let mut s = TfDataState::default();
    assert_eq!(
        register(&mut s, None, "m"),
        Ok(TfDataOutput::Dataset("1000".into()))
    );
    // No fingerprint dedupe: the same dataset again is a new dataset.
    assert_eq!(
        register(&mut s, None, "m"),
        Ok(TfDataOutput::Dataset("1001".into()))
    );
    // A client-chosen id that TF's counter would reach next is skipped by the counter.
    assert_eq!(
        register(&mut s, Some("1002"), "m"),
        Ok(TfDataOutput::Dataset("1002".into()))
    );
    assert_eq!(
        register(&mut s, None, "m"),
        Ok(TfDataOutput::Dataset("1003".into()))
    );
    assert_eq!(
        register(&mut s, Some("mine"), "m"),
        Ok(TfDataOutput::Dataset("mine".into()))
    );
    assert_eq!(
        register(&mut s, Some("mine"), "m"),
        Ok(TfDataOutput::Dataset("mine".into()))
    );
    let other = register(&mut s, Some("mine"), "other spec");
    assert_eq!(code(other.clone()), Code::InvalidArgument);
    assert!(message(other).contains("dataset ID mine"));
}

#[test]
fn a_named_job_is_found_again_and_must_be_asked_for_the_same_way() {
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    assert_eq!(
        job(&mut s, "1000", sharding::DYNAMIC, Some("j")),
        Ok(TfDataOutput::Job(5000))
    );
    assert_eq!(
        job(&mut s, "1000", sharding::DYNAMIC, Some("j")),
        Ok(TfDataOutput::Job(5000))
    );
    let mismatch = job(&mut s, "1000", sharding::OFF, Some("j"));
    assert_eq!(code(mismatch.clone()), Code::InvalidArgument);
    let m = message(mismatch);
    assert!(
        m.contains("name j") && m.contains("DYNAMIC") && m.contains("OFF"),
        "{m}"
    );
    // Anonymous jobs are never shared.
    assert_eq!(
        job(&mut s, "1000", sharding::OFF, None),
        Ok(TfDataOutput::Job(5001))
    );
    assert_eq!(s.jobs[&5001].name, "anonymous_job_5001_77");
    assert_eq!(
        code(job(&mut s, "nope", sharding::OFF, None)),
        Code::NotFound
    );
    assert_eq!(code(job(&mut s, "1000", 9, None)), Code::InvalidArgument);
}

#[test]
fn an_iteration_has_a_task_per_worker_and_clients_join_it() {
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "w1:1", &[]);
    worker(&mut s, "w2:1", &[]);
    job(&mut s, "1000", sharding::OFF, Some("j")).expect("job");
    let (c1, it, tasks) = iteration(&mut s, 5000, 1, 0);
    assert_eq!((c1, it, tasks.clone()), (3000, 2000, vec![4000, 4001]));
    let (c2, it2, tasks2) = iteration(&mut s, 5000, 1, 0);
    assert_eq!((c2, it2), (3001, 2000));
    assert!(tasks2.is_empty(), "joining makes no tasks");
    assert_eq!(s.iterations[&2000].num_clients, 2);
    // The next repetition is a new iteration.
    let (_, it3, tasks3) = iteration(&mut s, 5000, 2, 0);
    assert_eq!((it3, tasks3.len()), (2001, 2));
    // A worker registering later gets a task of every unfinished iteration.
    worker(&mut s, "w3:1", &[]);
    assert_eq!(s.workers["w3:1"].tasks.len(), 2);
    // Heartbeats of a known worker change nothing.
    let before = s.tasks.len();
    worker(&mut s, "w3:1", &[]);
    assert_eq!(s.tasks.len(), before);
    assert_eq!(
        code(op(
            &mut s,
            TfDataOp::GetOrCreateIteration {
                job: 9,
                repetition: 0,
                providers: vec![]
            }
        )),
        Code::NotFound
    );
}

#[test]
fn splits_are_handed_out_once_per_repetition() {
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    job(&mut s, "1000", sharding::DYNAMIC, None).expect("job");
    let (_, it, _) = iteration(&mut s, 5000, 1, 3);
    let got: Vec<_> = (0..4).map(|_| split(&mut s, it, 0)).collect();
    assert_eq!(got, vec![Some(0), Some(1), Some(2), None]);
    // The repetition is over for everyone asking for it.
    assert_eq!(split(&mut s, it, 0), None);
    assert_eq!(split(&mut s, it, 1), Some(0));
    // A later repetition asked for before this one ended starts it.
    assert_eq!(split(&mut s, it, 3), Some(0));
    assert_eq!(split(&mut s, it, 3), Some(1));
    let p = &s.iterations[&it].providers.as_ref().expect("providers")[0];
    assert_eq!((p.repetition, p.index), (3, 2));
    // A DYNAMIC iteration needs providers; other modes have none to ask.
    assert_eq!(
        code(op(
            &mut s,
            TfDataOp::GetOrCreateIteration {
                job: 5000,
                repetition: 2,
                providers: vec![]
            }
        )),
        Code::FailedPrecondition
    );
    job(&mut s, "1000", sharding::OFF, None).expect("job");
    let (_, off, _) = iteration(&mut s, 5001, 1, 0);
    let r = op(
        &mut s,
        TfDataOp::GetSplit {
            iteration: off,
            repetition: 0,
            provider: 0,
            max: 1,
        },
    );
    assert_eq!(code(r), Code::FailedPrecondition);
    let r = op(
        &mut s,
        TfDataOp::GetSplit {
            iteration: it,
            repetition: 3,
            provider: 1,
            max: 1,
        },
    );
    assert_eq!(code(r), Code::InvalidArgument);
    let r = op(
        &mut s,
        TfDataOp::GetSplit {
            iteration: 1,
            repetition: 0,
            provider: 0,
            max: 1,
        },
    );
    assert_eq!(code(r), Code::NotFound);
}

/// A GetSplit driven again with its request id (its answer was lost with the leader) gets the
/// split it was first given, and the provider does not move.
#[test]
fn a_retried_get_split_gets_the_same_split() {
    let mut s = CoordState::default();
    let mut changes = Vec::new();
    let mut seq = 0;
    let mut run = |s: &mut CoordState, op: TfDataOp, seq_: Option<u64>| {
        seq += 1;
        let request = Some(RequestId {
            client: 42,
            seq: seq_.unwrap_or(seq),
            acked_below: 1,
        });
        let cmd = Command {
            request,
            op: Op::TfData(op),
        };
        s.apply(&Proposal::new(1, vec![cmd]), &mut changes)
            .pop()
            .expect("a result")
    };
    run(
        &mut s,
        TfDataOp::RegisterDataset {
            requested_id: None,
            def: Bytes::new(),
            metadata: Bytes::new(),
            compression: 0,
        },
        None,
    )
    .expect("dataset");
    run(
        &mut s,
        TfDataOp::GetOrCreateJob {
            dataset: "1000".into(),
            sharding: sharding::DYNAMIC,
            name: None,
            anonymous_tag: 1,
            num_consumers: None,
            target_workers: 0,
            cross_trainer_cache: false,
        },
        None,
    )
    .expect("job");
    run(
        &mut s,
        TfDataOp::GetOrCreateIteration {
            job: 5000,
            repetition: 1,
            providers: splits(10),
        },
        None,
    )
    .expect("iteration");
    let get = || TfDataOp::GetSplit {
        iteration: 2000,
        repetition: 0,
        provider: 0,
        max: 1,
    };
    let first = run(&mut s, get(), Some(100));
    let again = run(&mut s, get(), Some(100));
    assert_eq!(
        first,
        Ok(Output::TfData(TfDataOutput::Splits { from: 0, count: 1 }))
    );
    assert_eq!(again, first);
    let next = run(&mut s, get(), Some(101));
    assert_eq!(
        next,
        Ok(Output::TfData(TfDataOutput::Splits { from: 1, count: 1 }))
    );
}

#[test]
fn an_iteration_finishes_with_its_last_task() {
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    worker(&mut s, "b:1", &[]);
    job(&mut s, "1000", sharding::OFF, None).expect("job");
    let (_, it, tasks) = iteration(&mut s, 5000, 1, 0);
    let finish = |s: &mut TfDataState, tasks: Vec<i64>| {
        op(
            s,
            TfDataOp::FinishTasks {
                address: "a:1".into(),
                tasks,
            },
        )
    };
    // An unknown task refuses the whole update.
    let r = finish(&mut s, vec![tasks[0], 9999]);
    assert_eq!(message(r), "Task 9999 not found");
    finish(&mut s, vec![tasks[0]]).expect("finish");
    assert!(!s.iterations[&it].finished);
    assert!(s.workers["a:1"].tasks.is_empty());
    // Finishing twice is skipped, as in TF.
    finish(&mut s, vec![tasks[0]]).expect("finish again");
    finish(&mut s, vec![tasks[1]]).expect("finish");
    assert!(s.iterations[&it].finished);
    // A worker registering after the iteration finished gets no task of it.
    worker(&mut s, "c:1", &[]);
    assert!(s.workers["c:1"].tasks.is_empty());
    assert_eq!(s.active_clients().count(), 0);
}

#[test]
fn a_worker_joining_a_round_robin_read_waits_for_every_consumer() {
    let mut s = TfDataState::default();
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
    let hb = |s: &mut TfDataState, client, current, blocked, client_round| {
        op(
            s,
            TfDataOp::ClientHeartbeat {
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
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    worker(&mut s, "b:1", &[]);
    job_with(&mut s, "1000", sharding::OFF, Some("rr"), Some(1)).expect("job");
    let (_, it, tasks) = iteration(&mut s, 5000, 1, 0);
    op(&mut s, TfDataOp::RemoveTask { task: tasks[0] }).expect("remove");
    assert!(!s.tasks.contains_key(&tasks[0]));
    assert_eq!(s.iterations[&it].tasks, vec![tasks[1]]);
    // Removing it again is not an error (TF answers removed).
    op(&mut s, TfDataOp::RemoveTask { task: tasks[0] }).expect("remove again");
    assert_eq!(s.round_robin_iterations_without("a:1"), vec![it]);
    worker(&mut s, "a:1", &[(it, 4)]);
    assert_eq!(s.iterations[&it].pending.len(), 1);
    assert_eq!(s.iterations[&it].pending[0].target_round, 5);
    // Only round-robin tasks can be removed.
    job(&mut s, "1000", sharding::OFF, None).expect("job");
    let (_, _, plain) = iteration(&mut s, 5001, 1, 0);
    let r = op(&mut s, TfDataOp::RemoveTask { task: plain[0] });
    assert_eq!(code(r), Code::FailedPrecondition);
}

#[test]
fn an_idle_iteration_is_collected_and_its_key_gets_a_new_iteration() {
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    job(&mut s, "1000", sharding::OFF, Some("j")).expect("job");
    let (c, it, tasks) = iteration(&mut s, 5000, 1, 0);
    let gc = TfDataOp::GarbageCollectIteration { iteration: it };
    assert_eq!(code(op(&mut s, gc.clone())), Code::FailedPrecondition);
    op(
        &mut s,
        TfDataOp::ReleaseClient {
            client: c,
            time_micros: 55,
        },
    )
    .expect("release");
    assert_eq!(s.iterations[&it].last_client_released_micros, 55);
    let again = TfDataOp::ReleaseClient {
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
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    let ask = |s: &mut TfDataState, disable| {
        op(
            s,
            TfDataOp::DisableCompression {
                dataset: "1000".into(),
                disable,
            },
        )
    };
    assert_eq!(
        ask(&mut s, false),
        Ok(TfDataOutput::Compression(Some(false)))
    );
    assert_eq!(
        ask(&mut s, true),
        Ok(TfDataOutput::Compression(Some(false)))
    );
    op(
        &mut s,
        TfDataOp::RegisterDataset {
            requested_id: None,
            def: Bytes::new(),
            metadata: Bytes::new(),
            compression: 1,
        },
    )
    .expect("uncompressed");
    let r = op(
        &mut s,
        TfDataOp::DisableCompression {
            dataset: "1001".into(),
            disable: true,
        },
    );
    assert_eq!(r, Ok(TfDataOutput::Compression(None)));
    let r = op(
        &mut s,
        TfDataOp::DisableCompression {
            dataset: "x".into(),
            disable: true,
        },
    );
    assert_eq!(message(r), "Dataset id x not found");
}

#[test]
fn the_state_survives_the_snapshot_codec() {
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    job_with(&mut s, "1000", sharding::DYNAMIC, Some("j"), None).expect("job");
    let (_, it, _) = iteration(&mut s, 5000, 1, 4);
    split(&mut s, it, 0);
    let bytes = crate::codec::encode("tfdata", &s).expect("encode");
    let back: TfDataState = crate::codec::decode("tfdata", &bytes).expect("decode");
    assert_eq!(back, s);
}

#[test]
fn a_lost_worker_gets_no_new_tasks_until_it_is_back() {
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    worker(&mut s, "b:1", &[]);
    op(
        &mut s,
        TfDataOp::WorkerLost {
            address: "b:1".into(),
        },
    )
    .expect("lost");
    let r = op(
        &mut s,
        TfDataOp::WorkerLost {
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
        TfDataOp::FinishTasks {
            address: "b:1".into(),
            tasks: vec![b_task],
        },
    )
    .expect("finish");
    op(
        &mut s,
        TfDataOp::WorkerLost {
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
    let mut s = TfDataState::default();
    register(&mut s, None, "m").expect("dataset");
    job(&mut s, "1000", sharding::DYNAMIC, None).expect("job");
    let (_, it, _) = iteration(&mut s, 5000, 1, 10);
    let lease = |s: &mut TfDataState, repetition, max| {
        op(
            s,
            TfDataOp::GetSplit {
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
        TfDataOutput::Splits { from: 0, count: 8 }
    );
    // The rest of the repetition, never past it.
    assert_eq!(
        lease(&mut s, 0, 8),
        TfDataOutput::Splits { from: 8, count: 2 }
    );
    assert_eq!(
        lease(&mut s, 0, 8),
        TfDataOutput::Splits { from: 0, count: 0 }
    );
    assert_eq!(s.splits_handed_out, 10);
    // max 0 is one split.
    assert_eq!(
        lease(&mut s, 1, 0),
        TfDataOutput::Splits { from: 0, count: 1 }
    );
}

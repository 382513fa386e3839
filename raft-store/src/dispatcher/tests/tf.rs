//! TensorFlow's RPCs: datasets, jobs, iterations, splits, finishing.

use bytes::Bytes;

use super::*;
use crate::command::{Command, Op, Output, Proposal};
use crate::error::RequestId;
use crate::state::CoordState;

#[test]
fn datasets_get_tensorflows_ids_and_a_chosen_id_must_match() {
    let mut s = DispatcherState::default();
    assert_eq!(
        register(&mut s, None, "m"),
        Ok(DispatcherOutput::Dataset("1000".into()))
    );
    // No fingerprint dedupe: the same dataset again is a new dataset.
    assert_eq!(
        register(&mut s, None, "m"),
        Ok(DispatcherOutput::Dataset("1001".into()))
    );
    // A client-chosen id that TF's counter would reach next is skipped by the counter.
    assert_eq!(
        register(&mut s, Some("1002"), "m"),
        Ok(DispatcherOutput::Dataset("1002".into()))
    );
    assert_eq!(
        register(&mut s, None, "m"),
        Ok(DispatcherOutput::Dataset("1003".into()))
    );
    assert_eq!(
        register(&mut s, Some("mine"), "m"),
        Ok(DispatcherOutput::Dataset("mine".into()))
    );
    assert_eq!(
        register(&mut s, Some("mine"), "m"),
        Ok(DispatcherOutput::Dataset("mine".into()))
    );
    let other = register(&mut s, Some("mine"), "other spec");
    assert_eq!(code(other.clone()), Code::InvalidArgument);
    assert!(message(other).contains("dataset ID mine"));
}

#[test]
fn a_named_job_is_found_again_and_must_be_asked_for_the_same_way() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    assert_eq!(
        job(&mut s, "1000", sharding::DYNAMIC, Some("j")),
        Ok(DispatcherOutput::Job(5000))
    );
    assert_eq!(
        job(&mut s, "1000", sharding::DYNAMIC, Some("j")),
        Ok(DispatcherOutput::Job(5000))
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
        Ok(DispatcherOutput::Job(5001))
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
    let mut s = DispatcherState::default();
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
            DispatcherOp::GetOrCreateIteration {
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
    let mut s = DispatcherState::default();
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
            DispatcherOp::GetOrCreateIteration {
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
        DispatcherOp::GetSplit {
            iteration: off,
            repetition: 0,
            provider: 0,
            max: 1,
        },
    );
    assert_eq!(code(r), Code::FailedPrecondition);
    let r = op(
        &mut s,
        DispatcherOp::GetSplit {
            iteration: it,
            repetition: 3,
            provider: 1,
            max: 1,
        },
    );
    assert_eq!(code(r), Code::InvalidArgument);
    let r = op(
        &mut s,
        DispatcherOp::GetSplit {
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
    let mut run = |s: &mut CoordState, op: DispatcherOp, seq_: Option<u64>| {
        seq += 1;
        let request = Some(RequestId {
            client: 42,
            seq: seq_.unwrap_or(seq),
            acked_below: 1,
        });
        let cmd = Command {
            request,
            op: Op::Dispatcher(op),
        };
        s.apply(&Proposal::new(1, vec![cmd]), &mut changes)
            .pop()
            .expect("a result")
    };
    run(
        &mut s,
        DispatcherOp::RegisterDataset {
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
        DispatcherOp::GetOrCreateJob {
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
        DispatcherOp::GetOrCreateIteration {
            job: 5000,
            repetition: 1,
            providers: splits(10),
        },
        None,
    )
    .expect("iteration");
    let get = || DispatcherOp::GetSplit {
        iteration: 2000,
        repetition: 0,
        provider: 0,
        max: 1,
    };
    let first = run(&mut s, get(), Some(100));
    let again = run(&mut s, get(), Some(100));
    assert_eq!(
        first,
        Ok(Output::Dispatcher(DispatcherOutput::Splits {
            from: 0,
            count: 1
        }))
    );
    assert_eq!(again, first);
    let next = run(&mut s, get(), Some(101));
    assert_eq!(
        next,
        Ok(Output::Dispatcher(DispatcherOutput::Splits {
            from: 1,
            count: 1
        }))
    );
}

#[test]
fn an_iteration_finishes_with_its_last_task() {
    let mut s = DispatcherState::default();
    register(&mut s, None, "m").expect("dataset");
    worker(&mut s, "a:1", &[]);
    worker(&mut s, "b:1", &[]);
    job(&mut s, "1000", sharding::OFF, None).expect("job");
    let (_, it, tasks) = iteration(&mut s, 5000, 1, 0);
    let finish = |s: &mut DispatcherState, tasks: Vec<i64>| {
        op(
            s,
            DispatcherOp::FinishTasks {
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

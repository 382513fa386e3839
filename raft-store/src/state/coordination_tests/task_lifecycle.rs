//! Tests of the task lifecycle: registration, reported errors, heartbeat timeouts,
//! WaitForAllTasks, and ShutdownTask without a shutdown barrier.

use super::*;

#[test]
fn registration_rules() {
    let mut s = cluster(2);
    assert_eq!(
        register(&mut s, w(0), 5),
        Ok(Output::Registered {
            service_incarnation: 77
        })
    );
    assert_eq!(
        register(&mut s, w(0), 5),
        Ok(Output::Registered {
            service_incarnation: 77
        }),
        "retry is idempotent"
    );
    // Worker 1 keeps the run going throughout (with no task connected, a new process would
    // begin a new run instead: see `runs`).
    register(&mut s, w(1), 50).expect("register");
    assert_eq!(
        code_of(&register(&mut s, TaskName::new("ps", 0), 1)),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        code_of(&register(&mut s, w(2), 1)),
        Some(Code::InvalidArgument)
    );
    // A restarted task (new incarnation) of a non-recoverable job: ABORTED, ERROR, propagated.
    let (r, changes) = run_changes(
        &mut s,
        0,
        Op::RegisterTask {
            task: w(0),
            incarnation: 6,
        },
    );
    assert_eq!(code_of(&r), Some(Code::Aborted));
    assert_eq!(state_of(&s, &w(0)), TaskState::Error);
    assert!(changes
        .iter()
        .any(|c| matches!(c, Change::ErrorRaised { seq: 1 })));
    // In ERROR it may not register until reset.
    assert_eq!(code_of(&register(&mut s, w(0), 7)), Some(Code::Aborted));
    assert_eq!(
        run(&mut s, 0, Op::ResetTask { task: w(0) }),
        Ok(Output::Done)
    );
    assert_eq!(state_of(&s, &w(0)), TaskState::Disconnected);
    assert!(register(&mut s, w(0), 7).is_ok());
    // Reset disconnects a connected task too (its agent may be in error on another task's error);
    // a disconnected task has nothing to reset.
    assert_eq!(
        run(&mut s, 0, Op::ResetTask { task: w(0) }),
        Ok(Output::Done)
    );
    assert_eq!(state_of(&s, &w(0)), TaskState::Disconnected);
    assert_eq!(
        code_of(&run(&mut s, 0, Op::ResetTask { task: w(0) })),
        Some(Code::FailedPrecondition)
    );
    // A recoverable task just reconnects with its new incarnation; nothing is propagated.
    let eval = TaskName::new("eval", 0);
    assert!(register(&mut s, eval.clone(), 1).is_ok());
    let (r, changes) = run_changes(
        &mut s,
        0,
        Op::RegisterTask {
            task: eval.clone(),
            incarnation: 2,
        },
    );
    assert!(r.is_ok());
    assert!(!changes
        .iter()
        .any(|c| matches!(c, Change::ErrorRaised { .. })));
    assert_eq!(
        s.cluster
            .as_ref()
            .and_then(|c| c.tasks.get(&eval))
            .map(|r| r.incarnation),
        Some(2)
    );
}

/// TensorFlow's `CoordinatedTask.recoverable`, sent with each registration: a task of a job that
/// is not recoverable becomes so by saying it is, and stops being so by saying it is not.
#[test]
fn a_task_says_at_registration_whether_it_is_recoverable() {
    let mut s = cluster(2);
    register(&mut s, w(1), 50).expect("register");
    let recoverable = |incarnation| Op::RegisterRecoverableTask {
        task: w(0),
        incarnation,
    };
    assert!(run(&mut s, 0, recoverable(1)).is_ok());
    // A new incarnation while connected: it just reconnects, and nobody is told.
    let (r, changes) = run_changes(&mut s, 0, recoverable(2));
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(state_of(&s, &w(0)), TaskState::Connected);
    assert!(!changes
        .iter()
        .any(|c| matches!(c, Change::ErrorRaised { .. })));
    // Its errors are not propagated either.
    let (r, changes) = run_changes(
        &mut s,
        0,
        Op::ReportError {
            task: w(0),
            code: Code::Internal,
            message: "recoverable failure".into(),
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert!(!changes
        .iter()
        .any(|c| matches!(c, Change::ErrorRaised { .. })));
    // Out of a reported error only through a reset, as in TensorFlow.
    assert_eq!(
        code_of(&run(&mut s, 0, recoverable(3))),
        Some(Code::Aborted)
    );
    assert_eq!(state_of(&s, &w(0)), TaskState::Error);
    assert!(run(&mut s, 0, Op::ResetTask { task: w(0) }).is_ok());
    assert!(run(&mut s, 0, recoverable(3)).is_ok());
    // Out of a lost connection (its heartbeats stopped) it registers again at once.
    assert!(run(
        &mut s,
        0,
        Op::HeartbeatTimeout {
            task: w(0),
            incarnation: 3,
            silent_ms: 20_000,
        }
    )
    .is_ok());
    assert_eq!(state_of(&s, &w(0)), TaskState::Error);
    assert!(run(&mut s, 0, recoverable(4)).is_ok());
    assert_eq!(state_of(&s, &w(0)), TaskState::Connected);
    // A plain registration says it is not recoverable: a restart is then ABORTED and propagated.
    assert!(register(&mut s, w(0), 4).is_ok());
    let (r, changes) = run_changes(
        &mut s,
        0,
        Op::RegisterTask {
            task: w(0),
            incarnation: 5,
        },
    );
    assert_eq!(code_of(&r), Some(Code::Aborted));
    assert!(changes
        .iter()
        .any(|c| matches!(c, Change::ErrorRaised { .. })));
}

#[test]
fn reported_errors_reach_everyone_else_and_fail_their_barriers() {
    let mut s = cluster(3);
    for i in 0..3 {
        register(&mut s, w(i), 1).expect("register");
    }
    assert_eq!(
        barrier(&mut s, "b", w(0), vec![w(0), w(1)], 0),
        Ok(Output::Barrier {
            counter: 0,
            outcome: None
        })
    );
    let (r, changes) = run_changes(
        &mut s,
        5,
        Op::ReportError {
            task: w(1),
            code: Code::Internal,
            message: "disk full".into(),
        },
    );
    assert_eq!(r, Ok(Output::Done));
    assert!(changes.contains(&Change::BarrierDone {
        id: "b".into(),
        counter: 0
    }));
    let c = s.cluster.as_ref().expect("cluster");
    match c.barriers.get("b").and_then(|b| b.outcome.clone()) {
        Some(Outcome::Failed {
            code: Code::Internal,
            message,
        }) => assert!(message.contains("disk full")),
        other => panic!("{other:?}"),
    }
    let event = c.errors.next_for(&w(2), 0).expect("w2 hears of it");
    assert_eq!(event.error.source, w(1));
    assert!(event.error.reported);
    assert!(
        c.errors.next_for(&w(1), 0).is_none(),
        "the source already knows"
    );
    // A new barrier with a participant in ERROR fails at once with INTERNAL.
    let r = barrier(&mut s, "c", w(0), vec![], 10);
    assert!(matches!(
        r,
        Ok(Output::Barrier {
            outcome: Some(Outcome::Failed {
                code: Code::Internal,
                ..
            }),
            ..
        })
    ));
}

#[test]
fn heartbeat_timeout_applies_only_to_the_incarnation_seen_silent() {
    let mut s = cluster(1);
    register(&mut s, w(0), 1).expect("register");
    let stale = Op::HeartbeatTimeout {
        task: w(0),
        incarnation: 99,
        silent_ms: 11_000,
    };
    assert_eq!(run(&mut s, 0, stale), Ok(Output::Done));
    assert_eq!(state_of(&s, &w(0)), TaskState::Connected);
    run(
        &mut s,
        0,
        Op::HeartbeatTimeout {
            task: w(0),
            incarnation: 1,
            silent_ms: 11_000,
        },
    )
    .expect("timeout");
    assert_eq!(state_of(&s, &w(0)), TaskState::Error);
    let err = s
        .cluster
        .as_ref()
        .and_then(|c| c.tasks.get(&w(0)))
        .and_then(|r| r.error.clone())
        .expect("error");
    assert_eq!(err.code, Code::Unavailable);
    assert!(
        err.message.contains("no heartbeat for 11000 ms"),
        "{}",
        err.message
    );
}

#[test]
fn wait_for_all_tasks_collects_devices() {
    let mut s = cluster(2);
    let dev = |n: u8| DeviceInfo::Tf(vec![bytes::Bytes::from(vec![n])]);
    assert_eq!(
        code_of(&run(
            &mut s,
            0,
            Op::WaitForAllTasks {
                task: w(0),
                devices: dev(0)
            }
        )),
        Some(Code::FailedPrecondition),
        "must register first"
    );
    for t in [w(0), w(1), TaskName::new("eval", 0)] {
        register(&mut s, t, 1).expect("register");
    }
    assert_eq!(
        run(
            &mut s,
            1,
            Op::WaitForAllTasks {
                task: w(0),
                devices: dev(0)
            }
        ),
        Ok(Output::Barrier {
            counter: 0,
            outcome: None
        })
    );
    run(
        &mut s,
        1,
        Op::WaitForAllTasks {
            task: TaskName::new("eval", 0),
            devices: dev(9),
        },
    )
    .expect("wait");
    let (r, changes) = run_changes(
        &mut s,
        2,
        Op::WaitForAllTasks {
            task: w(1),
            devices: dev(1),
        },
    );
    assert_eq!(
        r,
        Ok(Output::Barrier {
            counter: 0,
            outcome: Some(Outcome::Passed)
        })
    );
    assert!(changes.contains(&Change::BarrierDone {
        id: WAIT_FOR_ALL_TASKS_BARRIER.into(),
        counter: 0
    }));
    let c = s.cluster.as_ref().expect("cluster");
    assert_eq!(
        c.tasks.get(&w(1)).and_then(|r| r.devices.clone()),
        Some(dev(1))
    );
}

#[test]
fn shutdown_without_barrier_aborts_barriers_of_the_task() {
    let mut s = cluster(2);
    for i in 0..2 {
        register(&mut s, w(i), 1).expect("register");
    }
    barrier(&mut s, "b", w(0), vec![], 0).expect("arrive");
    run(&mut s, 0, Op::ShutdownTask { task: w(1) }).expect("shutdown");
    let outcome = s
        .cluster
        .as_ref()
        .and_then(|c| c.barriers.get("b"))
        .and_then(|b| b.outcome.clone());
    assert!(matches!(
        outcome,
        Some(Outcome::Failed {
            code: Code::Aborted,
            ..
        })
    ));
    assert_eq!(state_of(&s, &w(1)), TaskState::Disconnected);
}

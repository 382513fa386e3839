//! Tests of the barrier rules: bad requests, the shutdown barrier, the service's shutdown.

use super::*;

#[test]
fn barrier_input_errors() {
    let mut s = cluster(2);
    let r = |s: &mut CoordState, id: &str, timeout: i64, tasks: Vec<TaskName>, source: TaskName| {
        run(
            s,
            0,
            Op::Barrier {
                id: id.into(),
                counter: 0,
                tasks,
                timeout_ms: timeout,
                source,
            },
        )
    };
    assert_eq!(
        code_of(&r(&mut s, "", 10, vec![], w(0))),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        code_of(&r(&mut s, "x", -1, vec![], w(0))),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        code_of(&r(&mut s, "x", 10, vec![], TaskName::new("nope", 0))),
        Some(Code::InvalidArgument)
    );
    assert_eq!(
        code_of(&r(&mut s, "coord-internal:x", 10, vec![], w(0))),
        Some(Code::InvalidArgument)
    );
    // An unknown participant fails the barrier for everyone, later callers included.
    let out = r(&mut s, "y", 10, vec![w(0), w(7)], w(0));
    assert!(matches!(
        out,
        Ok(Output::Barrier {
            outcome: Some(Outcome::Failed {
                code: Code::InvalidArgument,
                ..
            }),
            ..
        })
    ));
    let out = r(&mut s, "y", 10, vec![w(0), w(1)], w(1));
    assert!(matches!(
        out,
        Ok(Output::Barrier {
            outcome: Some(Outcome::Failed {
                code: Code::InvalidArgument,
                ..
            }),
            ..
        })
    ));
    assert_eq!(
        s.cluster
            .as_ref()
            .map(|c| c.tasks.count_in(TaskState::Error)),
        Some(0),
        "bad input changes no task"
    );
}

#[test]
fn shutdown_barrier_disconnects_together_and_blames_stragglers() {
    let mut s = cluster(2);
    if let Some(c) = s.cluster.as_mut() {
        c.config.shutdown_barrier_timeout_ms = 500;
    }
    for t in [w(0), w(1), TaskName::new("eval", 0)] {
        register(&mut s, t, 1).expect("register");
    }
    assert_eq!(
        run(&mut s, 100, Op::ShutdownTask { task: w(0) }),
        Ok(Output::Barrier {
            counter: 0,
            outcome: None
        })
    );
    assert_eq!(
        state_of(&s, &w(0)),
        TaskState::Connected,
        "waits for the others"
    );
    run(
        &mut s,
        200,
        Op::ShutdownTask {
            task: TaskName::new("eval", 0),
        },
    )
    .expect("shutdown");
    // w1 never comes: the deadline (first arrival + 500 ms) passes.
    let (r, changes) = run_changes(
        &mut s,
        599,
        Op::ExpireBarrier {
            id: SHUTDOWN_BARRIER.into(),
            counter: 0,
        },
    );
    assert_eq!(r, Ok(Output::Done));
    assert!(
        changes.is_empty(),
        "not due before 600: deadline is 100 + 500"
    );
    let (_, changes) = run_changes(
        &mut s,
        600,
        Op::ExpireBarrier {
            id: SHUTDOWN_BARRIER.into(),
            counter: 0,
        },
    );
    assert!(changes.contains(&Change::BarrierDone {
        id: SHUTDOWN_BARRIER.into(),
        counter: 0
    }));
    assert_eq!(state_of(&s, &w(0)), TaskState::Disconnected);
    assert_eq!(state_of(&s, &w(1)), TaskState::Error);
    let c = s.cluster.as_ref().expect("cluster");
    assert!(
        c.errors.next_for(&w(1), 0).is_some(),
        "the straggler is told"
    );
    assert!(
        c.errors.next_for(&w(0), 0).is_none(),
        "those that shut down are not"
    );
}

#[test]
fn shutdown_service_aborts_every_pending_barrier() {
    let mut s = cluster(2);
    register(&mut s, w(0), 1).expect("register");
    barrier(&mut s, "b1", w(0), vec![], 0).expect("arrive");
    let (_, changes) = run_changes(
        &mut s,
        0,
        Op::ShutdownService {
            reason: "operator".into(),
        },
    );
    assert!(changes.contains(&Change::BarrierDone {
        id: "b1".into(),
        counter: 0
    }));
    let r = barrier(&mut s, "b1", w(1), vec![], 0);
    assert!(matches!(
        r,
        Ok(Output::Barrier {
            outcome: Some(Outcome::Failed {
                code: Code::Aborted,
                ..
            }),
            ..
        })
    ));
}

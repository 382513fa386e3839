//! The coordination service's rules, exercised through `CoordState::apply` with no runtime.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::command::{Command, Output, Proposal};
use crate::error::OpError;

/// A state with a cluster of `workers` worker tasks (and one recoverable `eval` task).
fn cluster(workers: u32) -> CoordState {
    let mut s = CoordState::default();
    let config = ClusterConfig {
        jobs: BTreeMap::from([("worker".to_string(), workers), ("eval".to_string(), 1)]),
        heartbeat_timeout_ms: 10_000,
        register_timeout_ms: 0,
        shutdown_barrier_timeout_ms: 0,
        recoverable_jobs: BTreeSet::from(["eval".to_string()]),
    };
    run(
        &mut s,
        0,
        Op::InitCluster {
            config,
            service_incarnation: 77,
        },
    )
    .expect("init");
    s
}

fn w(i: u32) -> TaskName {
    TaskName::new("worker", i)
}

fn run(s: &mut CoordState, now: u64, op: Op) -> CommandResult {
    run_changes(s, now, op).0
}

fn run_changes(s: &mut CoordState, now: u64, op: Op) -> (CommandResult, Vec<Change>) {
    let mut changes = Vec::new();
    let mut out = s.apply(
        &Proposal::new(now, vec![Command { request: None, op }]),
        &mut changes,
    );
    (out.pop().expect("one result"), changes)
}

fn code_of(r: &CommandResult) -> Option<Code> {
    match r {
        Err(OpError::Status { code, .. }) => Some(*code),
        _ => None,
    }
}

fn state_of(s: &CoordState, t: &TaskName) -> TaskState {
    s.cluster
        .as_ref()
        .and_then(|c| c.tasks.get(t))
        .map(|r| r.state)
        .expect("task")
}

fn register(s: &mut CoordState, t: TaskName, inc: u64) -> CommandResult {
    run(
        s,
        0,
        Op::RegisterTask {
            task: t,
            incarnation: inc,
        },
    )
}

fn barrier(
    s: &mut CoordState,
    id: &str,
    source: TaskName,
    tasks: Vec<TaskName>,
    now: u64,
) -> CommandResult {
    run(
        s,
        now,
        Op::Barrier {
            id: id.into(),
            counter: 0,
            tasks,
            timeout_ms: 1_000,
            source,
        },
    )
}

#[test]
fn init_cluster_happens_once() {
    let mut s = cluster(2);
    let again = run(
        &mut s,
        0,
        Op::InitCluster {
            config: ClusterConfig::default(),
            service_incarnation: 99,
        },
    );
    assert_eq!(
        again,
        Ok(Output::Registered {
            service_incarnation: 77
        })
    );
    assert_eq!(s.cluster.as_ref().map(|c| c.config.task_count()), Some(3));
}

#[test]
fn requests_before_init_are_refused() {
    let mut s = CoordState::default();
    assert_eq!(register(&mut s, w(0), 1), Err(OpError::NoCluster));
}

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

#[test]
fn coordination_apply_is_deterministic() {
    let script = |s: &mut CoordState| {
        let mut all = Vec::new();
        for i in 0..3 {
            all.push(run_changes(
                s,
                i,
                Op::RegisterTask {
                    task: w(i as u32),
                    incarnation: i,
                },
            ));
        }
        all.push(run_changes(
            s,
            10,
            Op::Barrier {
                id: "x".into(),
                counter: 0,
                tasks: vec![],
                timeout_ms: 50,
                source: w(0),
            },
        ));
        all.push(run_changes(
            s,
            20,
            Op::ReportError {
                task: w(2),
                code: Code::Unknown,
                message: "m".into(),
            },
        ));
        all.push(run_changes(
            s,
            70,
            Op::ExpireBarrier {
                id: "x".into(),
                counter: 0,
            },
        ));
        all
    };
    let (mut a, mut b) = (cluster(3), cluster(3));
    assert_eq!(script(&mut a), script(&mut b));
    assert_eq!(a, b);
}

fn alive(s: &mut CoordState, source: u32, of: &[u32]) -> (CommandResult, Vec<Change>) {
    run_changes(
        s,
        0,
        Op::GetAliveTasks {
            source: w(source),
            tasks: of.iter().map(|&i| w(i)).collect(),
        },
    )
}

#[test]
fn get_alive_tasks_waits_for_every_live_task_and_not_for_the_dead() {
    let mut s = cluster(3);
    for i in 0..3 {
        register(&mut s, w(i), 10 + u64::from(i)).expect("register");
    }
    let (r, _) = alive(&mut s, 0, &[0, 1, 2]);
    assert_eq!(
        r,
        Ok(Output::Alive {
            generation: 0,
            answer: None
        })
    );
    let (r, _) = alive(&mut s, 1, &[2, 1, 0]);
    assert_eq!(
        r,
        Ok(Output::Alive {
            generation: 0,
            answer: None
        }),
        "the same set, however ordered; task 2 has not asked"
    );
    // Task 2 dies: the round no longer waits for it, and everyone who asked is answered.
    let (_, changes) = run_changes(
        &mut s,
        0,
        Op::ReportError {
            task: w(2),
            code: Code::Internal,
            message: "gone".into(),
        },
    );
    assert!(changes.contains(&Change::BarrierDone {
        id: alive_wait_key(&alive_set_key(&[w(0), w(1), w(2)])),
        counter: 0
    }));
    let c = s.cluster.as_ref().expect("cluster");
    let set = alive_set_key(&[w(0), w(1), w(2)]);
    assert_eq!(c.alive.answer(&set, 0), Some(&vec![(w(0), 10), (w(1), 11)]));
    // The next round starts empty.
    let (r, _) = alive(&mut s, 0, &[0, 1, 2]);
    assert_eq!(
        r,
        Ok(Output::Alive {
            generation: 1,
            answer: None
        })
    );
    let (r, _) = alive(&mut s, 1, &[0, 1, 2]);
    assert_eq!(
        r,
        Ok(Output::Alive {
            generation: 1,
            answer: Some(vec![(w(0), 10), (w(1), 11)])
        })
    );
}

#[test]
fn get_alive_tasks_refuses_bad_sets() {
    let mut s = cluster(3);
    register(&mut s, w(0), 1).expect("register");
    let (r, _) = alive(&mut s, 0, &[1, 2]);
    assert_eq!(
        code_of(&r),
        Some(Code::InvalidArgument),
        "the asker is not in the set"
    );
    let (r, _) = alive(&mut s, 0, &[0, 9]);
    assert_eq!(
        code_of(&r),
        Some(Code::InvalidArgument),
        "task 9 does not exist"
    );
    assert!(
        s.cluster
            .as_ref()
            .expect("cluster")
            .alive
            .open()
            .next()
            .is_none(),
        "nothing changed"
    );
}

#[test]
fn registration_at_the_barrier_waits_for_every_participant_and_counts_task_changes() {
    let mut s = cluster(2);
    let version = |s: &CoordState| s.cluster.as_ref().expect("cluster").task_version;
    let v0 = version(&s);
    let at_barrier = |s: &mut CoordState, i: u32| {
        run(
            s,
            0,
            Op::RegisterAtBarrier {
                task: w(i),
                incarnation: 5,
                participants: vec![w(0), w(1)],
            },
        )
    };
    assert_eq!(
        at_barrier(&mut s, 0),
        Ok(Output::Barrier {
            counter: 0,
            outcome: None
        })
    );
    assert_eq!(state_of(&s, &w(0)), TaskState::Connected);
    assert!(version(&s) > v0, "a registration is a task change");
    assert_eq!(
        at_barrier(&mut s, 1),
        Ok(Output::Barrier {
            counter: 0,
            outcome: Some(Outcome::Passed)
        })
    );
    // A repeated registration (a retry) gets the stored outcome.
    assert_eq!(
        at_barrier(&mut s, 0),
        Ok(Output::Barrier {
            counter: 0,
            outcome: Some(Outcome::Passed)
        })
    );
    let r = run(
        &mut s,
        0,
        Op::RegisterAtBarrier {
            task: w(0),
            incarnation: 5,
            participants: vec![w(1)],
        },
    );
    assert_eq!(
        code_of(&r),
        Some(Code::InvalidArgument),
        "not a participant"
    );
}

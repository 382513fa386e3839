//! Tests of XLA's additions: GetAliveTasks rounds and registration at the barrier.

use super::*;
use std::sync::Arc;

/// Task `source` asks about tasks `of`: listed as builds before sets were runs committed it
/// when `of` starts with task 2, as runs otherwise (both must behave alike).
fn alive(s: &mut CoordState, source: u32, of: &[u32]) -> (CommandResult, Vec<Change>) {
    let op = if of.first() == Some(&2) {
        Op::GetAliveTasks {
            source: w(source),
            tasks: of.iter().map(|&i| w(i)).collect(),
        }
    } else {
        Op::GetAliveTasksOf {
            source: w(source),
            tasks: TaskSet::of_job("worker", of.iter().copied()),
        }
    };
    run_changes(s, 0, op)
}

fn set(of: &[u32]) -> TaskSet {
    TaskSet::of_job("worker", of.iter().copied())
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
        id: alive_wait_key(&set(&[0, 1, 2])),
        counter: 0
    }));
    let c = s.cluster.as_ref().expect("cluster");
    assert_eq!(
        c.alive.answer(&set(&[0, 1, 2]), 0),
        Some(&Arc::new(vec![(w(0), 10), (w(1), 11)]))
    );
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
            answer: Some(Arc::new(vec![(w(0), 10), (w(1), 11)]))
        })
    );
}

/// Tasks leaving one at a time while the others wait in a round move its count by one each:
/// the set is walked when the round opens and when it completes, not once a leaver (2,000
/// leavers of a 100,000-task job were 2,000 walks of 100,000 tasks, in the apply that also
/// keeps the leader's term).
#[test]
fn tasks_leaving_during_a_round_cost_a_count_not_a_walk() {
    const TASKS: u32 = 1_000;
    const STAYERS: u32 = 10;
    let mut s = cluster(TASKS);
    for i in 0..TASKS {
        register(&mut s, w(i), 1).expect("register");
    }
    let all: Vec<u32> = (0..TASKS).collect();
    let walks = || crate::state::alive::WALKS.with(std::cell::Cell::get);
    let before = walks();
    for i in TASKS - STAYERS..TASKS {
        let (r, _) = alive(&mut s, i, &all);
        assert_eq!(
            r,
            Ok(Output::Alive {
                generation: 0,
                answer: None
            })
        );
    }
    // The leavers in a scattered order, every third put in error rather than shut down.
    let leavers = (0..TASKS - STAYERS).map(|i| (i * 7) % (TASKS - STAYERS));
    let mut done = Vec::new();
    for (n, i) in leavers.enumerate() {
        let op = match n % 3 {
            2 => Op::ReportError {
                task: w(i),
                code: Code::Internal,
                message: "gone".into(),
            },
            _ => Op::ShutdownTask { task: w(i) },
        };
        let (r, changes) = run_changes(&mut s, 0, op);
        r.expect("the task left");
        done.extend(changes.into_iter().filter(|c| {
            *c == Change::BarrierDone {
                id: alive_wait_key(&set(&all)),
                counter: 0,
            }
        }));
        let left = n as u32 + 1;
        assert_eq!(
            done.is_empty(),
            left < TASKS - STAYERS,
            "the round is done once the last leaver left ({left} left)"
        );
    }
    let c = s.cluster.as_ref().expect("cluster");
    let stayed: Vec<(TaskName, u64)> = (TASKS - STAYERS..TASKS).map(|i| (w(i), 1)).collect();
    assert_eq!(c.alive.answer(&set(&all), 0), Some(&Arc::new(stayed)));
    assert!(
        walks() - before <= 3,
        "{} walks of the set for a round that {} tasks left",
        walks() - before,
        TASKS - STAYERS
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

#[test]
fn registration_at_the_barrier_of_runs_meets_registrations_of_lists() {
    // A log written across an upgrade: task 0 listed its participants, task 1 names them as runs.
    let mut s = cluster(3);
    let listed = Op::RegisterAtBarrier {
        task: w(0),
        incarnation: 5,
        participants: vec![w(0), w(1), w(2)],
    };
    let runs = |i: u32, participants: TaskSet| Op::RegisterAtBarrierOf {
        task: w(i),
        incarnation: 5,
        participants,
    };
    let waiting = Ok(Output::Barrier {
        counter: 0,
        outcome: None,
    });
    assert_eq!(run(&mut s, 0, listed), waiting);
    assert_eq!(run(&mut s, 0, runs(1, set(&[0, 1, 2]))), waiting);
    assert_eq!(
        run(&mut s, 0, runs(2, set(&[2, 0, 1]))),
        Ok(Output::Barrier {
            counter: 0,
            outcome: Some(Outcome::Passed)
        })
    );
    let r = run(&mut s, 0, runs(0, set(&[0, 1, 2, 3])));
    assert!(
        matches!(&r, Err(OpError::Status { code: Code::InvalidArgument, message }) if message.contains("task:3")),
        "the task outside the cluster is named: {r:?}"
    );
}

#[test]
fn a_round_of_many_tasks_counts_its_askers() {
    const N: u32 = 2_000;
    let mut s = cluster(N);
    for i in 0..N {
        register(&mut s, w(i), u64::from(i)).expect("register");
    }
    let all: Vec<u32> = (0..N).collect();
    for i in 0..N - 1 {
        let (r, _) = alive(&mut s, i, &all);
        assert_eq!(
            r,
            Ok(Output::Alive {
                generation: 0,
                answer: None
            }),
            "task {i}"
        );
    }
    // An asker asking again is counted once.
    let (r, _) = alive(&mut s, 7, &all);
    assert_eq!(
        r,
        Ok(Output::Alive {
            generation: 0,
            answer: None
        })
    );
    let (r, changes) = alive(&mut s, N - 1, &all);
    let expected: Vec<(TaskName, u64)> = (0..N).map(|i| (w(i), u64::from(i))).collect();
    assert_eq!(
        r,
        Ok(Output::Alive {
            generation: 0,
            answer: Some(Arc::new(expected))
        })
    );
    assert!(changes.contains(&Change::BarrierDone {
        id: alive_wait_key(&set(&all)),
        counter: 0
    }));
    assert_eq!(
        alive_wait_key(&set(&all)),
        "coord-internal:alive:worker:0-1999"
    );
}

#[test]
fn a_decoded_round_counts_its_askers_again() {
    let mut s = cluster(3);
    for i in 0..3 {
        register(&mut s, w(i), 1).expect("register");
    }
    alive(&mut s, 0, &[0, 1, 2]).0.expect("ask");
    // As a replica restored from a snapshot holds it: the count is not part of the state.
    let bytes = crate::codec::encode("state", &s).expect("encode");
    let mut restored: CoordState = crate::codec::decode("state", &bytes).expect("decode");
    assert_eq!(restored, s);
    alive(&mut restored, 1, &[0, 1, 2]).0.expect("ask");
    let (r, _) = alive(&mut restored, 2, &[0, 1, 2]);
    assert!(
        matches!(r, Ok(Output::Alive { answer: Some(ref a), .. }) if a.len() == 3),
        "{r:?}"
    );
}

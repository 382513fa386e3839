//! Tests of XLA's additions: GetAliveTasks rounds and registration at the barrier.

use super::*;

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

//! Barrier records on their own: instances, outcomes, reuse of an id, and the pending ids the
//! records keep. A file of its own to keep `barriers.rs` to the records.

use super::*;

fn config(n: u32) -> ClusterConfig {
    ClusterConfig {
        jobs: BTreeMap::from([("w".to_string(), n)]),
        ..ClusterConfig::default()
    }
}

fn t(i: u32) -> TaskName {
    TaskName::new("w", i)
}

#[test]
fn passes_when_all_arrive_and_then_answers_from_the_record() {
    let c = config(3);
    let mut b = Barriers::default();
    for i in 0..2 {
        assert_eq!(
            b.arrive("x", 0, Participants::All, 1000, &t(i), 10, &c),
            Arrival::Waiting { counter: 0 }
        );
    }
    assert_eq!(
        b.arrive("x", 0, Participants::All, 1000, &t(2), 20, &c),
        Arrival::Done {
            counter: 0,
            outcome: Outcome::Passed
        }
    );
    // A repeated call, even from a task that already arrived, gets the stored result.
    assert_eq!(
        b.arrive("x", 0, Participants::All, 1000, &t(0), 30, &c),
        Arrival::Done {
            counter: 0,
            outcome: Outcome::Passed
        }
    );
    // The deadline was fixed by the first arrival.
    assert_eq!(b.get("x").and_then(|r| r.deadline_ms), Some(1010));
}

#[test]
fn a_task_leaving_looks_at_the_pending_barriers_not_at_every_id_the_job_used() {
    let c = config(4);
    let mut b = Barriers::default();
    let one = |i| Participants::Only([t(i)].into_iter().collect());
    // A long job's history: a passed barrier per checkpoint step.
    for step in 0..1_000 {
        let id = format!("checkpoint_{step}");
        assert!(matches!(
            b.arrive(&id, 0, one(step % 4), 0, &t(step % 4), 0, &c),
            Arrival::Done { .. }
        ));
    }
    assert_eq!(
        b.arrive("now", 0, Participants::All, 0, &t(0), 0, &c),
        Arrival::Waiting { counter: 0 }
    );
    let kept = |b: &Barriers| b.pending_ids.0.get().map(BTreeSet::len);
    assert_eq!(kept(&b), None, "found at first use");
    assert_eq!(b.pending_with(&t(1), &c), [("now".to_string(), 0)]);
    assert_eq!(kept(&b), Some(1));

    // Each kind of change keeps the ids: a start, a pass, a failure, a cancellation, an
    // expiry, an instance created failed.
    b.arrive("other", 0, one(2), 100, &t(3), 0, &c);
    assert_eq!(
        kept(&b),
        Some(1),
        "an outsider's arrival fails the instance"
    );
    b.arrive("later", 0, Participants::All, 100, &t(3), 0, &c);
    assert_eq!(kept(&b), Some(2));
    assert!(b.fail("now", 0, Code::Aborted, "gone".into()));
    assert!(b.expire("later", 0, 100, &c));
    assert_eq!(kept(&b), Some(0));
    assert!(b.cancel("checkpoint_0", 1, &t(0)).is_ok());
    assert!(b
        .fail_or_create("fresh", 0, Code::Internal, "x".into())
        .is_ok());
    b.arrive("checkpoint_1", 1, one(1), 0, &t(1), 0, &c);
    assert_eq!(
        b.arrive("now", 1, Participants::All, 0, &t(0), 0, &c),
        Arrival::Waiting { counter: 1 }
    );
    assert_eq!(kept(&b), Some(1));
    assert!(b.kept_pending_agrees());

    // A decoded state finds them again, once.
    let bytes = crate::codec::encode("barriers", &b).expect("encodes");
    let decoded: Barriers = crate::codec::decode("barriers", &bytes).expect("decodes");
    assert_eq!(kept(&decoded), None);
    assert_eq!(decoded.pending_with(&t(2), &c), [("now".to_string(), 1)]);
    assert!(decoded.kept_pending_agrees());
}

#[test]
fn an_id_is_reused_with_the_next_counter() {
    let c = config(1);
    let mut b = Barriers::default();
    assert!(matches!(
        b.arrive("x", 0, Participants::All, 0, &t(0), 0, &c),
        Arrival::Done { .. }
    ));
    assert_eq!(
        b.arrive("x", 1, Participants::All, 0, &t(0), 0, &c),
        Arrival::Done {
            counter: 1,
            outcome: Outcome::Passed
        }
    );
    assert!(matches!(
        b.arrive("x", 0, Participants::All, 0, &t(0), 0, &c),
        Arrival::Done { counter: 0, .. }
    ));
    assert!(matches!(
        b.arrive("x", 5, Participants::All, 0, &t(0), 0, &c),
        Arrival::Rejected { .. }
    ));
}

#[test]
fn conflicting_sets_and_outsiders_fail_the_barrier_for_everyone() {
    let c = config(3);
    let mut b = Barriers::default();
    let two = Participants::Only([t(0), t(1)].into_iter().collect());
    assert_eq!(
        b.arrive("x", 0, two.clone(), 0, &t(0), 0, &c),
        Arrival::Waiting { counter: 0 }
    );
    let r = b.arrive("x", 0, Participants::All, 0, &t(1), 0, &c);
    assert!(matches!(
        r,
        Arrival::Done {
            outcome: Outcome::Failed {
                code: Code::InvalidArgument,
                ..
            },
            ..
        }
    ));
    assert!(matches!(
        b.arrive("x", 0, two.clone(), 0, &t(0), 0, &c),
        Arrival::Done {
            outcome: Outcome::Failed { .. },
            ..
        }
    ));
    let r = b.arrive("y", 0, two, 0, &t(2), 0, &c);
    assert!(matches!(
        r,
        Arrival::Done {
            outcome: Outcome::Failed {
                code: Code::InvalidArgument,
                ..
            },
            ..
        }
    ));
    // An explicit list of every task is the same set as "all".
    let all = Participants::Only((0..3).map(t).collect());
    assert_eq!(
        b.arrive("z", 0, Participants::All, 0, &t(0), 0, &c),
        Arrival::Waiting { counter: 0 }
    );
    assert_eq!(
        b.arrive("z", 0, all, 0, &t(1), 0, &c),
        Arrival::Waiting { counter: 0 }
    );
}

#[test]
fn expiry_cancel_and_failed_precondition() {
    let c = config(2);
    let mut b = Barriers::default();
    b.arrive("x", 0, Participants::All, 100, &t(0), 1000, &c);
    assert!(!b.expire("x", 0, 1099, &c), "not due yet");
    assert!(b.expire("x", 0, 1100, &c));
    let msg = match b.get("x").and_then(|r| r.outcome.clone()) {
        Some(Outcome::Failed {
            code: Code::DeadlineExceeded,
            message,
        }) => message,
        other => panic!("{other:?}"),
    };
    assert!(msg.contains("/job:w/replica:0/task:1"), "{msg}");
    assert_eq!(b.cancel("never-started", 0, &t(0)), Ok(true));
    assert!(matches!(
        b.arrive("never-started", 0, Participants::All, 0, &t(1), 0, &c),
        Arrival::Done {
            outcome: Outcome::Failed {
                code: Code::Cancelled,
                ..
            },
            ..
        }
    ));
    b.arrive("p", 0, Participants::All, 0, &t(0), 0, &c);
    b.arrive("p", 0, Participants::All, 0, &t(1), 0, &c);
    assert!(matches!(
        b.cancel("p", 0, &t(0)),
        Err((Code::FailedPrecondition, _))
    ));
}

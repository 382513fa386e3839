//! Job runs: a job started again on the ensemble gets a clean run.

use bytes::Bytes;

use super::*;

fn put(s: &mut CoordState, key: &str) {
    run(
        s,
        0,
        Op::KvPut {
            key: key.into(),
            value: Bytes::from("v"),
            overwrite: true,
        },
    )
    .expect("put");
}

fn register(s: &mut CoordState, t: TaskName, incarnation: u64) -> CommandResult {
    run(
        s,
        0,
        Op::RegisterTask {
            task: t,
            incarnation,
        },
    )
}

fn timeout(s: &mut CoordState, t: TaskName, incarnation: u64) {
    run(
        s,
        0,
        Op::HeartbeatTimeout {
            task: t,
            incarnation,
            silent_ms: 20_000,
        },
    )
    .expect("timeout");
}

fn incarnation(s: &CoordState) -> u64 {
    s.cluster.as_ref().expect("cluster").service_incarnation
}

fn state_of(s: &CoordState, t: &TaskName) -> TaskState {
    s.cluster
        .as_ref()
        .expect("cluster")
        .tasks
        .get(t)
        .expect("task")
        .state
}

fn is_over(s: &CoordState) -> bool {
    s.runs
        .is_over(s.cluster.as_ref().expect("cluster").config.task_count())
}

/// A job whose tasks (two workers and the evaluator) registered, wrote a key and died (heartbeat
/// timeouts).
fn a_finished_run() -> CoordState {
    let mut s = cluster(2);
    put(&mut s, "before-the-job");
    register(&mut s, w(0), 1).expect("register");
    register(&mut s, w(1), 2).expect("register");
    assert_eq!(s.runs.number, 1);
    put(&mut s, "run-1/key");
    timeout(&mut s, w(0), 1);
    timeout(&mut s, w(1), 2);
    assert!(!is_over(&s), "the evaluator never came");
    let eval = TaskName::new("eval", 0);
    register(&mut s, eval.clone(), 3).expect("register");
    assert!(!is_over(&s), "the evaluator is connected");
    timeout(&mut s, eval, 3);
    assert!(is_over(&s));
    s
}

#[test]
fn a_job_started_again_gets_a_clean_run() {
    let mut s = a_finished_run();
    put(&mut s, "between-runs");
    let first = incarnation(&s);
    // A new process of worker 0: the next run begins.
    register(&mut s, w(0), 4).expect("registers in a new run");
    assert_eq!(s.runs.number, 2);
    assert_ne!(
        incarnation(&s),
        first,
        "a new run has a new service incarnation"
    );
    assert_eq!(state_of(&s, &w(0)), TaskState::Connected);
    assert_eq!(
        state_of(&s, &w(1)),
        TaskState::Disconnected,
        "no longer in ERROR"
    );
    assert!(s.kv.get("run-1/key").is_none(), "the run's keys went");
    assert!(s.kv.get("before-the-job").is_some());
    assert!(s.kv.get("between-runs").is_some());
    register(&mut s, w(1), 5).expect("the other task registers too");
    assert!(s
        .cluster
        .as_ref()
        .expect("cluster")
        .barriers
        .pending()
        .next()
        .is_none());
}

#[test]
fn a_restart_while_others_are_connected_is_the_same_run() {
    let mut s = cluster(2);
    register(&mut s, w(0), 1).expect("register");
    register(&mut s, w(1), 2).expect("register");
    put(&mut s, "k");
    let e = register(&mut s, w(0), 9).expect_err("restarted while worker 1 runs");
    assert!(
        matches!(
            e,
            OpError::Status {
                code: Code::Aborted,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(s.runs.number, 1);
    assert!(s.kv.get("k").is_some());
}

#[test]
fn reconnecting_after_a_reset_is_the_same_run() {
    let mut s = a_finished_run();
    run(&mut s, 0, Op::ResetTask { task: w(0) }).expect("reset");
    // The same process (TF's agent keeps its incarnation across Reset and Connect).
    register(&mut s, w(0), 1).expect("registers again");
    assert_eq!(s.runs.number, 1);
    assert!(s.kv.get("run-1/key").is_some());
}

#[test]
fn an_operator_ends_a_run() {
    let mut s = cluster(2);
    register(&mut s, w(0), 1).expect("register");
    put(&mut s, "k");
    let (r, changes) = run_changes(
        &mut s,
        0,
        Op::EndRun {
            reason: "by hand".into(),
        },
    );
    r.expect("end run");
    assert!(changes.contains(&Change::RunStarted { number: 2 }));
    assert_eq!(state_of(&s, &w(0)), TaskState::Disconnected);
    assert!(s.kv.get("k").is_none());
    register(&mut s, w(0), 1).expect("registers into the new run");
    assert_eq!(s.runs.number, 2);
}

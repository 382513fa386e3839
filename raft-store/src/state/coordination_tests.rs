//! The coordination service's rules, exercised through `CoordState::apply` with no runtime.
//!
//! This module holds the fixtures (a cluster, a command run through `apply`) and the tests of
//! `apply` as a whole; the rules' tests sit in submodules named after the `coordination` module
//! whose rules they exercise:
//!
//! - `task_lifecycle`: registration, reported errors, heartbeat timeouts, WaitForAllTasks,
//!   ShutdownTask without a shutdown barrier.
//! - `barrier_lifecycle`: bad barrier requests, the shutdown barrier, the service's shutdown.
//! - `xla`: GetAliveTasks rounds and registration at the barrier.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::command::{Command, Output, Proposal};
use crate::error::OpError;

mod barrier_lifecycle;
mod runs;
mod task_lifecycle;
mod xla;

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

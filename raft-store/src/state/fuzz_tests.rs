//! Random commands over small id spaces (so they hit existing and missing tasks, keys and barriers
//! alike), through the whole coordination state machine: apply never panics, a refused command
//! leaves the state exactly as it was, and what the state keeps counted (tasks per state, the
//! tasks an open GetAliveTasks round waits for) agrees with its records. One refusal is an
//! outcome of its own, as in TensorFlow's service: a task of a job that is not recoverable
//! registering again with a new incarnation is refused ABORTED *and* put in ERROR (it restarted;
//! its job must learn of it).

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::*;
use crate::command::{Command, Proposal};

#[test]
fn fuzz_commands_never_panic_and_refusals_change_nothing() {
    let mut next = coord_proto::fuzz::xorshift(0x0C00_7D5E_ED00);
    let mut s = CoordState::default();
    let (mut applied, mut refused, mut restarted) = (0u32, 0u32, 0u32);
    let codes = [
        Code::Unavailable,
        Code::Internal,
        Code::Aborted,
        Code::Cancelled,
    ];
    for step in 0..20_000u64 {
        let task = TaskName::new(
            ["worker", "eval", "ghost"][(next() % 3) as usize],
            (next() % 4) as u32,
        );
        let tasks: Vec<TaskName> = (0..next() % 3)
            .map(|i| TaskName::new("worker", ((next() + i) % 4) as u32))
            .collect();
        let key = ["a", "a/b", "a/b/c", "n", "7"][(next() % 5) as usize].to_string();
        let id = format!("b{}", next() % 3);
        let counter = (next() % 4) as i64 - 1;
        let op = match next() % 18 {
            0 => Op::InitCluster {
                config: ClusterConfig {
                    jobs: BTreeMap::from([
                        ("worker".to_string(), (next() % 5) as u32),
                        ("eval".to_string(), 1),
                    ]),
                    heartbeat_timeout_ms: next() % 20_000,
                    register_timeout_ms: next() % 2 * 5_000,
                    shutdown_barrier_timeout_ms: next() % 2 * 5_000,
                    recoverable_jobs: BTreeSet::from(["eval".to_string()]),
                },
                service_incarnation: next() % 3,
            },
            1 | 2 => Op::KvPut {
                key,
                value: Bytes::from(vec![b'0' + (next() % 10) as u8; (next() % 3) as usize]),
                overwrite: next().is_multiple_of(2),
            },
            3 => Op::KvDelete { key },
            4 => Op::KvIncrement {
                key,
                delta: [i64::MAX, i64::MIN, 1, -1][(next() % 4) as usize],
            },
            5 | 6 if next().is_multiple_of(4) => Op::RegisterRecoverableTask {
                task,
                incarnation: next() % 3,
            },
            5 | 6 => Op::RegisterTask {
                task,
                incarnation: next() % 3,
            },
            7 => Op::ReportError {
                task,
                code: codes[(next() % 4) as usize],
                message: "boom".into(),
            },
            8 => Op::HeartbeatTimeout {
                task,
                incarnation: next() % 3,
                silent_ms: next() % 30_000,
            },
            9 => Op::ResetTask { task },
            10 => Op::ShutdownTask { task },
            11 => Op::WaitForAllTasks {
                task,
                devices: DeviceInfo::Tf(vec![Bytes::from_static(b"d")]),
            },
            12 | 13 => Op::Barrier {
                id,
                counter,
                tasks,
                timeout_ms: (next() % 3) as i64 * 1_000 - 1_000,
                source: task,
            },
            14 => Op::CancelBarrier {
                id,
                counter,
                source: task,
            },
            15 => Op::ExpireBarrier { id, counter },
            16 if next().is_multiple_of(2) => Op::GetAliveTasksOf {
                source: task,
                tasks: TaskSet::of_tasks(&tasks),
            },
            16 => Op::RegisterAtBarrierOf {
                task,
                incarnation: next() % 3,
                participants: TaskSet::of_tasks(&tasks),
            },
            _ => Op::GetAliveTasks {
                source: task,
                tasks,
            },
        };
        let registering = match &op {
            Op::RegisterTask { task, .. }
            | Op::RegisterRecoverableTask { task, .. }
            | Op::RegisterAtBarrierOf { task, .. }
            | Op::RegisterAtBarrier { task, .. } => Some(task.clone()),
            _ => None,
        };
        let before = s.clone();
        let mut changes = Vec::new();
        let out = s.apply(
            &Proposal::new(step * 100, vec![Command { request: None, op }]),
            &mut changes,
        );
        match out.as_slice() {
            [Ok(_)] => applied += 1,
            [Err(OpError::Status {
                code: Code::Aborted,
                message,
            })] if message.ends_with("it restarted, and its job is not recoverable") => {
                let task = registering.expect("only a registration restarts a task");
                let was = before.cluster.as_ref().and_then(|c| c.tasks.get(&task));
                assert_eq!(was.map(|r| r.state), Some(TaskState::Connected));
                let record = s.cluster.as_ref().and_then(|c| c.tasks.get(&task));
                assert_eq!(
                    record.map(|r| r.state),
                    Some(TaskState::Error),
                    "step {step}: a restarted task is put in error"
                );
                assert!(changes.contains(&Change::TaskChanged { task }));
                restarted += 1;
            }
            [Err(_)] => {
                refused += 1;
                // Every proposal sweeps expired client sessions, whatever its commands do (these
                // commands carry no request id, so nothing else touches the session table).
                let mut before = before;
                before.sessions = s.sessions.clone();
                assert_eq!(
                    s, before,
                    "step {step}: a refused command changed the state"
                );
                assert!(
                    changes.is_empty(),
                    "step {step}: a refused command reported changes"
                );
            }
            other => panic!("step {step}: {} results for one command", other.len()),
        }
        // What the registry and the rounds keep counted, the commands moving it, is what a walk
        // of the records gives.
        if let Some(c) = &s.cluster {
            for state in [
                TaskState::Disconnected,
                TaskState::Connected,
                TaskState::Error,
            ] {
                let walked = c.tasks.iter().filter(|(_, r)| r.state == state).count();
                assert_eq!(c.tasks.count_in(state), walked, "step {step}: {state:?}");
            }
            assert!(
                c.alive.kept_counts_agree(&c.tasks),
                "step {step}: a GetAliveTasks round's count"
            );
            assert!(
                c.barriers.kept_pending_agrees(),
                "step {step}: the pending barrier ids"
            );
        }
    }
    assert!(
        applied > 2_000 && refused > 2_000 && restarted > 0,
        "applied {applied}, refused {refused}, restarted {restarted}: the fuzz did not reach \
         every path"
    );
}

//! The replicated state and its deterministic `apply`.
//!
//! [`CoordState::apply`] is a pure function of (state, proposal): no clock, no randomness, no I/O.
//! It also reports the [`Change`]s it made so the server can wake parked calls and feed watches
//! without polling the state.
//!
//! Its modules, bottom up (each uses only those before it, and `crate::error`):
//!
//! - `cluster`: task names and the cluster configuration.
//! - `tasks`: the task registry and the error feed.
//! - `barriers`: barrier instances and their outcomes.
//! - `alive`: XLA's GetAliveTasks rounds.
//! - `change`: the [`Change`]s apply reports.
//!
//! These are the coordination records. They know nothing of commands: `crate::command` spells its
//! ops and outputs with them, and the modules that take commands sit above `crate::command`:
//!
//! - `kv`: the replicated key-value store.
//! - `sessions`: the results kept so a retried request applies once.
//! - `coordination`: the coordination service's transitions over the records.
//! - `runs`: job runs: a job started again gets a clean run.
//! - `quota`: the memory quota on the whole state.
//! - this module: [`CoordState`] and `apply`, which routes each command.

pub(crate) mod alive;
pub(crate) mod barriers;
mod change;
pub(crate) mod cluster;
mod coordination;
#[cfg(test)]
mod coordination_tests;
#[cfg(test)]
mod fuzz_tests;
mod kv;
mod quota;
mod runs;
mod sessions;
pub(crate) mod tasks;

use serde::{Deserialize, Serialize};

pub use alive::{set_key as alive_set_key, wait_key as alive_wait_key, AliveAnswer, AliveQueries};
pub use barriers::{BarrierRecord, Barriers, Outcome, Participants};
pub use change::Change;
pub use cluster::{list_tasks, ClusterConfig, TaskName};
pub use coordination::{
    Cluster, INTERNAL_BARRIER_PREFIX, REGISTER_BARRIER, SHUTDOWN_BARRIER,
    WAIT_FOR_ALL_TASKS_BARRIER,
};
pub use kv::{KvEntry, KvStore, KvStoreBeforeRaw};
pub use quota::Quota;
pub use runs::JobRuns;
pub use sessions::{SessionTable, SESSION_IDLE_TTL_MS};
pub use tasks::{
    DeviceInfo, ErrorEvent, ErrorFeed, TaskError, TaskRecord, TaskRegistry, TaskState,
};

// `Code` lives in the leaf `error` module; `state::Code` stays for callers.
pub use crate::error::Code;

use crate::command::{Command, CommandResult, Op, Output, Proposal};
use crate::dispatcher::{DispatcherOp, DispatcherState};
use crate::error::OpError;

/// Whether `op` may grow the records outside the key-value store (everything but the store's own
/// ops and the quota's).
fn grows_records(op: &Op) -> bool {
    !matches!(
        op,
        Op::KvPut { .. }
            | Op::KvDelete { .. }
            | Op::KvIncrement { .. }
            | Op::SetQuota { .. }
            | Op::Raw(_)
    )
}

/// `value`'s encoded size: what it takes in a snapshot.
fn encoded_len<T: Serialize>(value: &T) -> u64 {
    crate::codec::encoded_len(value)
}

/// Everything the ensemble agrees on. A snapshot is exactly this value.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordState {
    pub kv: KvStore,
    pub sessions: SessionTable,
    /// The coordinated job; `None` until the first leader sets it up.
    pub cluster: Option<Cluster>,
    /// The tf.data dispatcher, behind both of its surfaces (snapshots before format 6 held two:
    /// see `dispatcher::legacy`).
    pub dispatcher: DispatcherState,
    /// Which run of the job this is (snapshots of the first format lack it).
    pub runs: JobRuns,
    /// The memory quota and its alarm (snapshots before format 5 lack it).
    pub quota: Quota,
}

impl CoordState {
    /// Applies every command of `proposal` in order and returns one result per command.
    pub fn apply(&mut self, proposal: &Proposal, changes: &mut Vec<Change>) -> Vec<CommandResult> {
        let now = proposal.proposed_at_ms;
        self.sessions.expire(now);
        proposal
            .commands
            .iter()
            .map(|cmd| self.apply_command(cmd, now, changes))
            .collect()
    }

    fn apply_command(
        &mut self,
        cmd: &Command,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if let Some(req) = &cmd.request {
            if let Some(previous) = self.sessions.replay(req, now_ms) {
                return previous;
            }
        }
        let result = match self.quota_refusal(&cmd.op) {
            Some(refusal) => {
                self.quota.alarm = true;
                Err(refusal)
            }
            None => self.apply_op(&cmd.op, now_ms, changes),
        };
        // A refused command grew nothing (its session record is measured with the sessions).
        if result.is_ok()
            && grows_records(&cmd.op)
            && self.quota.note_record_write(encoded_len(&cmd.op))
        {
            self.measure_records();
        }
        self.quota.settle(self.usage());
        // "Not set up yet" (or "queue empty" for a blocking pop) is a refusal to try again later,
        // not an outcome: remembering it would answer the retry with the same refusal forever.
        if let Some(req) = cmd
            .request
            .as_ref()
            .filter(|_| !matches!(&result, Err(e) if e.is_transient()))
        {
            self.sessions.record(req, &result);
        }
        result
    }

    /// Bytes the state counts against its quota.
    pub fn usage(&self) -> u64 {
        self.kv.bytes() + self.quota.records_bytes
    }

    /// The quota's refusal of `op`, if it would grow the state past the quota. Apply refuses it
    /// and raises the alarm; while the alarm is up, the leader refuses such writes before
    /// proposing them, so a writer past the quota cannot grow the Raft log either.
    pub fn quota_refusal(&self, op: &Op) -> Option<OpError> {
        let growth = match op {
            Op::KvPut {
                key,
                value,
                overwrite,
            } => self.kv.growth_of_put(key, value, *overwrite),
            Op::KvIncrement { key, .. } => self.kv.growth_of_increment(key),
            Op::Raw(raw) => self.kv.raw().growth_of(raw),
            Op::Dispatcher(
                DispatcherOp::RegisterDataset { .. }
                | DispatcherOp::GetOrCreateJob { .. }
                | DispatcherOp::GetOrCreateIteration { .. }
                | DispatcherOp::RegisterDefinition { .. }
                | DispatcherOp::JoinJob { .. },
            ) => encoded_len(op),
            _ => return None,
        };
        if growth == 0 {
            return None;
        }
        self.quota.refusal(self.usage(), growth, || match op {
            Op::KvPut { key, .. } => format!("the put of key {key:?}"),
            Op::KvIncrement { key, .. } => format!("the increment of new key {key:?}"),
            Op::Dispatcher(d) => d.to_string(),
            other => other.to_string(),
        })
    }

    /// Measures the records outside the key-value store (see `quota`).
    fn measure_records(&mut self) {
        let records = encoded_len(&(&self.sessions, &self.cluster, &self.dispatcher, &self.runs));
        self.quota.measured(records);
    }

    fn apply_op(&mut self, op: &Op, now_ms: u64, changes: &mut Vec<Change>) -> CommandResult {
        match op {
            Op::KvPut {
                key,
                value,
                overwrite,
            } => self.kv.put(key, value, *overwrite, changes),
            Op::KvDelete { key } => self.kv.delete(key, changes),
            Op::KvIncrement { key, delta } => self.kv.increment(key, *delta, changes),
            Op::Raw(op) => self.kv.apply_raw(op, changes),
            Op::InitCluster {
                config,
                service_incarnation,
            } => {
                let cluster = self.cluster.get_or_insert_with(|| {
                    changes.push(Change::ClusterInitialized);
                    Cluster::new(config.clone(), *service_incarnation)
                });
                Ok(Output::Registered {
                    service_incarnation: cluster.service_incarnation,
                })
            }
            // The one place a dispatcher result becomes a command's result.
            Op::Dispatcher(op) => self.dispatcher.apply(op).map(Output::Dispatcher),
            Op::LegacyDispatch(op) => self
                .dispatcher
                .apply_legacy(op, now_ms)
                .map(Output::Dispatcher),
            Op::EndRun { .. } if self.cluster.is_none() => Err(OpError::NoCluster),
            Op::EndRun { .. } => {
                self.runs
                    .end_run(self.cluster.as_mut(), &mut self.kv, changes);
                Ok(Output::Done)
            }
            Op::SetQuota { bytes } => {
                self.quota.bytes = *bytes;
                self.measure_records();
                Ok(Output::Done)
            }
            op => {
                if let Op::RegisterTask { task, incarnation }
                | Op::RegisterRecoverableTask { task, incarnation }
                | Op::RegisterAtBarrier {
                    task, incarnation, ..
                } = op
                {
                    self.runs.before_registration(
                        self.cluster.as_mut(),
                        &mut self.kv,
                        task,
                        *incarnation,
                        changes,
                    );
                }
                self.apply_to_cluster(op, now_ms, changes)
            }
        }
    }

    fn apply_to_cluster(
        &mut self,
        op: &Op,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        match self.cluster.as_mut() {
            None => Err(OpError::NoCluster),
            Some(c) => {
                let before = changes.len();
                let result = apply_coordination(c, op, now_ms, changes);
                if changes[before..]
                    .iter()
                    .any(|ch| matches!(ch, Change::TaskChanged { .. }))
                {
                    c.tasks_changed(changes);
                    self.runs.after_task_changes(Some(c), &self.kv);
                }
                result
            }
        }
    }
}

/// The task and barrier commands; KV and cluster setup are handled by the caller.
fn apply_coordination(
    c: &mut Cluster,
    op: &Op,
    now_ms: u64,
    changes: &mut Vec<Change>,
) -> CommandResult {
    match op {
        Op::RegisterTask { task, incarnation } => c.register(task, *incarnation, false, changes),
        Op::RegisterRecoverableTask { task, incarnation } => {
            c.register(task, *incarnation, true, changes)
        }
        Op::RegisterAtBarrier {
            task,
            incarnation,
            participants,
        } => c.register_at_barrier(task, *incarnation, participants, now_ms, changes),
        Op::GetAliveTasks { source, tasks } => c.get_alive_tasks(source, tasks, changes),
        Op::ReportError {
            task,
            code,
            message,
        } => c.report_error(task, *code, message, changes),
        Op::HeartbeatTimeout {
            task,
            incarnation,
            silent_ms,
        } => c.heartbeat_timeout(task, *incarnation, *silent_ms, changes),
        Op::ResetTask { task } => c.reset(task, changes),
        Op::ShutdownTask { task } => c.shutdown_task(task, now_ms, changes),
        Op::WaitForAllTasks { task, devices } => c.wait_for_all(task, devices, now_ms, changes),
        Op::Barrier {
            id,
            counter,
            tasks,
            timeout_ms,
            source,
        } => c.barrier(id, *counter, tasks, *timeout_ms, source, now_ms, changes),
        Op::CancelBarrier {
            id,
            counter,
            source,
        } => c.cancel_barrier(id, *counter, source, changes),
        Op::ExpireBarrier { id, counter } => c.expire_barrier(id, *counter, now_ms, changes),
        Op::ShutdownService { reason } => c.shutdown_service(reason, changes),
        Op::KvPut { .. }
        | Op::KvDelete { .. }
        | Op::KvIncrement { .. }
        | Op::InitCluster { .. }
        | Op::EndRun { .. }
        | Op::LegacyDispatch(_)
        | Op::Dispatcher(_)
        | Op::SetQuota { .. }
        | Op::Raw(_) => Err(OpError::Status {
            code: Code::Internal,
            message: format!("{op} reached the coordination dispatcher"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::error::RequestId;

    fn cmd(client: u64, seq: u64, op: Op) -> Command {
        Command {
            request: Some(RequestId {
                client,
                seq,
                acked_below: 1,
            }),
            op,
        }
    }

    fn incr(key: &str) -> Op {
        Op::KvIncrement {
            key: key.into(),
            delta: 1,
        }
    }

    #[test]
    fn a_retried_command_is_applied_once() {
        let mut s = CoordState::default();
        let mut ch = Vec::new();
        let first = s.apply(&Proposal::new(1, vec![cmd(9, 1, incr("n"))]), &mut ch);
        // The same request again, in a later entry (a retry after a leader change).
        let again = s.apply(&Proposal::new(2, vec![cmd(9, 1, incr("n"))]), &mut ch);
        assert_eq!(first, again);
        assert_eq!(
            s.kv.get("n").map(|e| e.value.clone()),
            Some(Bytes::from("1"))
        );
        assert_eq!(ch.len(), 1, "the retry changed nothing");
    }

    #[test]
    fn a_refusal_before_cluster_setup_is_not_remembered() {
        let mut s = CoordState::default();
        let mut ch = Vec::new();
        let register = || {
            cmd(
                5,
                1,
                Op::RegisterTask {
                    task: TaskName::new("w", 0),
                    incarnation: 1,
                },
            )
        };
        let first = s.apply(&Proposal::new(1, vec![register()]), &mut ch);
        assert_eq!(first, vec![Err(OpError::NoCluster)]);
        s.apply(
            &Proposal::new(
                2,
                vec![Command {
                    request: None,
                    op: Op::InitCluster {
                        config: ClusterConfig {
                            jobs: [("w".to_string(), 1)].into_iter().collect(),
                            ..ClusterConfig::default()
                        },
                        service_incarnation: 3,
                    },
                }],
            ),
            &mut ch,
        );
        // The retry of the same request is applied now.
        let retry = s.apply(&Proposal::new(3, vec![register()]), &mut ch);
        assert_eq!(
            retry,
            vec![Ok(Output::Registered {
                service_incarnation: 3
            })]
        );
    }

    #[test]
    fn apply_is_deterministic() {
        let proposals: Vec<Proposal> = (0..50u64)
            .map(|i| {
                let op = match i % 3 {
                    0 => Op::KvPut {
                        key: format!("d/{}", i % 7),
                        value: Bytes::from(vec![i as u8; 3]),
                        overwrite: i % 2 == 0,
                    },
                    1 => incr(&format!("c/{}", i % 4)),
                    _ => Op::KvDelete {
                        key: format!("d/{}", i % 5),
                    },
                };
                Proposal::new(i * 1000, vec![cmd(i % 3, i, op)])
            })
            .collect();
        let run = || {
            let mut s = CoordState::default();
            let mut ch = Vec::new();
            let results: Vec<_> = proposals.iter().map(|p| s.apply(p, &mut ch)).collect();
            (s, results, ch)
        };
        assert_eq!(run(), run());
    }

    #[test]
    fn failed_commands_change_nothing() {
        let mut s = CoordState::default();
        let mut ch = Vec::new();
        s.apply(
            &Proposal::new(
                1,
                vec![cmd(
                    1,
                    1,
                    Op::KvPut {
                        key: "k".into(),
                        value: Bytes::from("v"),
                        overwrite: false,
                    },
                )],
            ),
            &mut ch,
        );
        let before = s.kv.clone();
        let out = s.apply(
            &Proposal::new(
                2,
                vec![cmd(
                    1,
                    2,
                    Op::KvPut {
                        key: "k".into(),
                        value: Bytes::from("w"),
                        overwrite: false,
                    },
                )],
            ),
            &mut ch,
        );
        assert_eq!(out, vec![Err(OpError::AlreadyExists { key: "k".into() })]);
        assert_eq!(s.kv, before);
        let out = s.apply(
            &Proposal::new(
                3,
                vec![cmd(
                    1,
                    3,
                    Op::KvPut {
                        key: "k".into(),
                        value: Bytes::from("w"),
                        overwrite: true,
                    },
                )],
            ),
            &mut ch,
        );
        assert_eq!(out, vec![Ok(Output::Done)]);
    }
}

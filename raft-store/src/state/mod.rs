//! The replicated state and its deterministic `apply`.
//!
//! [`CoordState::apply`] is a pure function of (state, proposal): no clock, no randomness, no I/O.
//! It also reports the [`Change`]s it made so the server can wake parked calls and feed watches
//! without polling the state.
//!
//! Its modules, bottom up (each uses only those before it, and `crate::error`):
//!
//! - `derived`: the wrapper of what the records keep derived from themselves.
//! - `cluster`: task names and the cluster configuration.
//! - `task_set`: sets of tasks as runs of task numbers.
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
//! - `space`: one namespace's records ([`Space`]) and the apply of one command to them.
//! - `namespace_limits`, `namespaces`: the named namespaces, their limits, declaration and
//!   deletion.
//! - this module: [`CoordState`] (the default namespace's space and the named ones) and
//!   `apply`, which routes each command to its namespace.

pub(crate) mod alive;
pub(crate) mod barriers;
mod change;
pub(crate) mod cluster;
mod coordination;
#[cfg(test)]
mod coordination_tests;
mod derived;
#[cfg(test)]
mod fuzz_tests;
mod kv;
pub mod namespace_limits;
mod namespaces;
mod quota;
mod runs;
mod sessions;
mod space;
pub(crate) mod task_set;
pub(crate) mod tasks;

use serde::{Deserialize, Serialize};

pub use alive::{wait_key as alive_wait_key, AliveAnswer, AliveQueries};
pub use barriers::{BarrierRecord, Barriers, Outcome, Participants};
pub use change::Change;
pub use cluster::{list_tasks, ClusterConfig, TaskName};
pub use coordination::{
    Cluster, INTERNAL_BARRIER_PREFIX, REGISTER_BARRIER, SHUTDOWN_BARRIER,
    WAIT_FOR_ALL_TASKS_BARRIER,
};
pub use kv::{KvEntry, KvStore, KvStoreBeforeRaw};
pub use namespace_limits::{name_problem, NamespaceLimits, DEFAULT_NAMESPACE, MAX_NAME_BYTES};
pub use namespaces::{not_found as namespace_not_found, Namespace, Namespaces};
pub use quota::Quota;
pub use runs::JobRuns;
pub use sessions::MAX_RESULTS_PER_SESSION;
pub use sessions::{SessionTable, SESSION_IDLE_TTL_MS};
pub use space::Space;
pub use task_set::TaskSet;
pub use tasks::{
    DeviceInfo, ErrorEvent, ErrorFeed, TaskError, TaskRecord, TaskRegistry, TaskState,
};

// `Code` lives in the leaf `error` module; `state::Code` stays for callers.
pub use crate::error::Code;

use crate::command::{Command, CommandResult, Op, Proposal};
use crate::error::{OpError, RequestId};
use space::Around;

/// Everything the ensemble agrees on: the default namespace, and the named ones. A snapshot is
/// exactly this value (the default namespace first, encoded as the whole state was before
/// namespaces).
///
/// It dereferences to the default namespace's [`Space`]: the replicas' own job, which every
/// surface serves when a call is bound to no namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct CoordState {
    pub default: Space,
    pub namespaces: Namespaces,
}

impl std::ops::Deref for CoordState {
    type Target = Space;
    fn deref(&self) -> &Space {
        &self.default
    }
}

impl std::ops::DerefMut for CoordState {
    fn deref_mut(&mut self) -> &mut Space {
        &mut self.default
    }
}

impl From<Space> for CoordState {
    fn from(default: Space) -> Self {
        Self {
            default,
            namespaces: Namespaces::default(),
        }
    }
}

impl CoordState {
    /// Applies every command of `proposal` in order and returns one result per command.
    pub fn apply(&mut self, proposal: &Proposal, changes: &mut Vec<Change>) -> Vec<CommandResult> {
        let now = proposal.proposed_at_ms;
        self.default.sessions.expire(now);
        self.namespaces.expire_sessions(now);
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
        let request = cmd.request.as_ref();
        match &cmd.op {
            Op::InNamespace { namespace, op } => {
                let outside = self.default.usage();
                self.namespaces.apply_in(
                    namespace,
                    request,
                    op,
                    now_ms,
                    changes,
                    &mut self.default.quota,
                    outside,
                )
            }
            Op::DeclareNamespace { .. }
            | Op::DeleteNamespace { .. }
            | Op::ExpireNamespace { .. } => {
                self.apply_to_namespaces(request, &cmd.op, now_ms, changes)
            }
            op => {
                let others = self.namespaces.usage();
                self.default.apply_command(
                    request,
                    op,
                    now_ms,
                    changes,
                    Around {
                        others,
                        ..Around::default()
                    },
                )
            }
        }
    }

    /// A declaration or deletion, answered once per request like any command (its session is
    /// the default namespace's: operators and sidecars declare from outside every namespace).
    fn apply_to_namespaces(
        &mut self,
        request: Option<&RequestId>,
        op: &Op,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if let Some(previous) = request.and_then(|r| self.default.sessions.replay(r, now_ms)) {
            return previous;
        }
        let result = match op {
            Op::DeclareNamespace {
                namespace,
                config,
                limits,
                service_incarnation,
            } => self.namespaces.declare(
                namespace,
                config,
                limits,
                *service_incarnation,
                now_ms,
                changes,
            ),
            Op::DeleteNamespace { namespace } => self.namespaces.delete(namespace, changes),
            Op::ExpireNamespace {
                namespace,
                idle_since_ms,
            } => self.namespaces.expire(namespace, *idle_since_ms, changes),
            other => Err(OpError::Status {
                code: Code::Internal,
                message: format!("{other} reached the namespaces"),
            }),
        };
        self.default.quota.settle(self.usage());
        if let Some(req) = request {
            self.default.sessions.record(req, &result);
        }
        result
    }

    /// Bytes the whole state counts against the ensemble's quota.
    pub fn usage(&self) -> u64 {
        self.default.usage() + self.namespaces.usage()
    }

    /// The quota's refusal of `op` in the default namespace, if it would grow the state past the
    /// quota.
    pub fn quota_refusal(&self, op: &Op) -> Option<OpError> {
        self.default
            .refusal(op, self.namespaces.usage(), None, None)
            .map(|(e, _)| e)
    }

    /// While an alarm of a bound `op` meets in namespace `ns` (`None`: the default) is up, that
    /// bound's refusal of `op`: the leader's check before it proposes, so a writer past a bound
    /// cannot grow the Raft log either. (A write to a namespace that does not exist is left to
    /// apply, which refuses it.)
    pub fn refusal_while_alarmed(&self, ns: Option<&str>, op: &Op) -> Option<OpError> {
        let Some(name) = ns else {
            return self
                .default
                .quota
                .alarm
                .then(|| self.quota_refusal(op))
                .flatten();
        };
        let n = self.namespaces.get(name)?;
        if !(n.space.quota.alarm || self.default.quota.alarm) {
            return None;
        }
        let others = self.usage() - n.space.usage();
        n.space
            .refusal(
                op,
                others,
                Some(&self.default.quota),
                Some((name, n.limits.max_keys)),
            )
            .map(|(e, _)| e)
    }

    /// The space of namespace `name` (`None`: the default one), if it exists.
    pub fn space(&self, name: Option<&str>) -> Option<&Space> {
        match name {
            None => Some(&self.default),
            Some(n) => self.namespaces.get(n).map(|ns| &ns.space),
        }
    }

    /// Every namespace's space: the default one (`None`) first, then the named ones by name.
    pub fn spaces(&self) -> impl Iterator<Item = (Option<&str>, &Space)> {
        let named = self
            .namespaces
            .iter()
            .map(|(n, ns)| (Some(n.as_str()), &ns.space));
        std::iter::once((None, &self.default)).chain(named)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::command::Output;

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

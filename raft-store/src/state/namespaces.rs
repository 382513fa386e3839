//! Namespaces: one ensemble, many jobs.
//!
//! A named namespace is a [`Space`] of its own (keys, sessions, the job and its tasks, runs,
//! barriers, the dispatcher) with its [`NamespaceLimits`]. Nothing of one namespace is reachable
//! from another: a command reaches a namespace only wrapped in [`Op::InNamespace`], which the
//! server adds from the call's connection, never from a field the client fills.
//!
//! A namespace exists from its declaration ([`Op::DeclareNamespace`]: the sidecar's flags on first
//! contact, or `coordctl ns create`) until its deletion ([`Op::DeleteNamespace`], one entry that
//! drops it whole); a deleted name declared again is a fresh namespace. A declaration of an
//! existing namespace with another shape is refused naming the differences, so two jobs that
//! happen to pick one name do not silently share it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::change::Change;
use super::cluster::ClusterConfig;
use super::coordination::Cluster;
use super::namespace_limits::{name_problem, NamespaceLimits, DEFAULT_NAMESPACE};
use super::quota::Quota;
use super::space::{Around, Space};
use super::tasks::TaskState;
use crate::command::{CommandResult, Op, Output};
use crate::error::{Code, OpError, RequestId};

/// One named namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespace {
    pub space: Space,
    pub limits: NamespaceLimits,
    /// The job it was declared with (`space.cluster` holds the same, while it has one).
    pub config: ClusterConfig,
    /// Proposal time of its declaration.
    pub created_at_ms: u64,
    /// Proposal time of its last command (its declaration, at first): its TTL counts from here
    /// once no task of it is connected.
    pub last_active_ms: u64,
}

impl Namespace {
    /// No task of its job is connected.
    pub fn no_task_connected(&self) -> bool {
        self.space
            .cluster
            .as_ref()
            .is_none_or(|c| c.tasks.count_in(TaskState::Connected) == 0)
    }

    /// Whether its TTL has run out at `now_ms`: it has one, no task is connected, and it has had
    /// no command for that long.
    pub fn expired_at(&self, now_ms: u64) -> bool {
        self.limits.ttl_ms > 0
            && self.no_task_connected()
            && now_ms.saturating_sub(self.last_active_ms) >= self.limits.ttl_ms
    }
}

/// Every named namespace, by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Namespaces {
    map: BTreeMap<String, Namespace>,
}

fn invalid(message: String) -> OpError {
    OpError::Status {
        code: Code::InvalidArgument,
        message,
    }
}

/// The refusal of a call to a namespace that does not exist.
pub fn not_found(name: &str) -> OpError {
    OpError::Status {
        code: Code::NotFound,
        message: format!(
            "namespace {name:?} does not exist: declare it (coord-proxy --namespace {name} with the job's flags, or coordctl ns create {name})"
        ),
    }
}

impl Namespaces {
    pub fn get(&self, name: &str) -> Option<&Namespace> {
        self.map.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Namespace)> {
        self.map.iter()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Bytes every named namespace counts against the ensemble's quota.
    pub fn usage(&self) -> u64 {
        self.map.values().map(|n| n.space.usage()).sum()
    }

    /// Forgets idle request sessions in every namespace.
    pub(crate) fn expire_sessions(&mut self, now_ms: u64) {
        for ns in self.map.values_mut() {
            ns.space.sessions.expire(now_ms);
        }
    }

    /// Applies `op` in namespace `name`. `ensemble` is the ensemble's quota and `outside` the
    /// bytes the default namespace holds.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn apply_in(
        &mut self,
        name: &str,
        request: Option<&RequestId>,
        op: &Op,
        now_ms: u64,
        changes: &mut Vec<Change>,
        ensemble: &mut Quota,
        outside: u64,
    ) -> CommandResult {
        if let Op::InitCluster { .. }
        | Op::SetQuota { .. }
        | Op::LegacyDispatch(_)
        | Op::InNamespace { .. }
        | Op::DeclareNamespace { .. }
        | Op::DeleteNamespace { .. } = op
        {
            return Err(invalid(format!(
                "{op} cannot be applied in namespace {name:?}: a namespace is set up by its declaration"
            )));
        }
        let total = outside + self.usage();
        let Some(ns) = self.map.get_mut(name) else {
            return Err(not_found(name));
        };
        let others = total - ns.space.usage();
        ns.last_active_ms = ns.last_active_ms.max(now_ms);
        let mut inner = Vec::new();
        let result = ns.space.apply_command(
            request,
            op,
            now_ms,
            &mut inner,
            Around {
                others,
                ensemble: Some(ensemble),
                namespace: Some(name),
                max_keys: ns.limits.max_keys,
            },
        );
        changes.extend(inner.into_iter().map(|change| Change::InNamespace {
            namespace: name.to_string(),
            change: Box::new(change),
        }));
        result
    }

    /// Creates namespace `name`, or confirms it exists with exactly this shape.
    pub(crate) fn declare(
        &mut self,
        name: &str,
        config: &ClusterConfig,
        limits: &NamespaceLimits,
        service_incarnation: u64,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if name == DEFAULT_NAMESPACE {
            return Err(invalid(format!(
                "namespace {DEFAULT_NAMESPACE:?} is the replicas' own, shaped by their flags: it cannot be declared"
            )));
        }
        if let Some(problem) = name_problem(name) {
            return Err(invalid(problem));
        }
        if limits.max_tasks > 0 && config.task_count() as u64 > limits.max_tasks {
            return Err(OpError::Status {
                code: Code::ResourceExhausted,
                message: format!(
                    "namespace {name:?}: its job has {} tasks, its limit is {} (max_tasks)",
                    config.task_count(),
                    limits.max_tasks
                ),
            });
        }
        if let Some(ns) = self.map.get(name) {
            let mut differences = config_differences(&ns.config, config);
            differences.extend(ns.limits.differences(limits));
            if !differences.is_empty() {
                return Err(OpError::Status {
                    code: Code::FailedPrecondition,
                    message: format!(
                        "namespace {name:?} exists with another shape: {}; delete it first or declare the same",
                        differences.join(", ")
                    ),
                });
            }
            return Ok(Output::Declared {
                created: false,
                service_incarnation: ns
                    .space
                    .cluster
                    .as_ref()
                    .map_or(0, |c| c.service_incarnation),
            });
        }
        let space = Space {
            cluster: (!config.jobs.is_empty())
                .then(|| Cluster::new(config.clone(), service_incarnation)),
            quota: Quota::with_bound(limits.max_bytes),
            ..Space::default()
        };
        self.map.insert(
            name.to_string(),
            Namespace {
                space,
                limits: *limits,
                config: config.clone(),
                created_at_ms: now_ms,
                last_active_ms: now_ms,
            },
        );
        changes.push(Change::NamespaceDeclared {
            namespace: name.to_string(),
        });
        Ok(Output::Declared {
            created: true,
            service_incarnation,
        })
    }

    /// Drops namespace `name` whole.
    pub(crate) fn delete(&mut self, name: &str, changes: &mut Vec<Change>) -> CommandResult {
        if name == DEFAULT_NAMESPACE {
            return Err(invalid(format!(
                "namespace {DEFAULT_NAMESPACE:?} is the replicas' own: it cannot be deleted"
            )));
        }
        if self.map.remove(name).is_none() {
            return Err(not_found(name));
        }
        changes.push(Change::NamespaceDeleted {
            namespace: name.to_string(),
        });
        Ok(Output::Done)
    }
}

impl Namespaces {
    /// Deletes namespace `name` if it is still idle since `idle_since_ms` with no task
    /// connected (the leader saw its TTL run out); a namespace used since stays.
    pub(crate) fn expire(
        &mut self,
        name: &str,
        idle_since_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        let Some(ns) = self.map.get(name) else {
            return Err(not_found(name));
        };
        if ns.last_active_ms != idle_since_ms || !ns.no_task_connected() || ns.limits.ttl_ms == 0 {
            return Err(OpError::Status {
                code: Code::FailedPrecondition,
                message: format!("namespace {name:?} was used since it was seen idle; kept"),
            });
        }
        self.delete(name, changes)
    }
}

/// The fields of `ours` that differ from `declared`, as `name ours (declared: theirs)`.
fn config_differences(ours: &ClusterConfig, declared: &ClusterConfig) -> Vec<String> {
    let mut out = Vec::new();
    if ours.jobs != declared.jobs {
        out.push(format!(
            "jobs {:?} (declared: {:?})",
            ours.jobs, declared.jobs
        ));
    }
    let numbers = [
        (
            "heartbeat_timeout_ms",
            ours.heartbeat_timeout_ms,
            declared.heartbeat_timeout_ms,
        ),
        (
            "register_timeout_ms",
            ours.register_timeout_ms,
            declared.register_timeout_ms,
        ),
        (
            "shutdown_barrier_timeout_ms",
            ours.shutdown_barrier_timeout_ms,
            declared.shutdown_barrier_timeout_ms,
        ),
    ];
    for (name, a, b) in numbers {
        if a != b {
            out.push(format!("{name} {a} (declared: {b})"));
        }
    }
    if ours.recoverable_jobs != declared.recoverable_jobs {
        out.push(format!(
            "recoverable_jobs {:?} (declared: {:?})",
            ours.recoverable_jobs, declared.recoverable_jobs
        ));
    }
    out
}

#[cfg(test)]
#[path = "namespaces_tests.rs"]
mod tests;

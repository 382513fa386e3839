//! One namespace's world: its key-value store, request sessions, coordinated job, tf.data
//! dispatcher, runs and byte bound, and the apply of one command to it.
//!
//! The default namespace is a [`Space`] (the state's own, whose bound is the ensemble's quota),
//! and so is every named namespace (whose bound is its byte limit): one apply serves both, so a
//! job in a namespace gets exactly the semantics it gets alone. What a write must also fit in,
//! outside its space, comes in as [`Around`].

use serde::{Deserialize, Serialize};

use super::change::Change;
use super::cluster::TaskName;
use super::coordination::Cluster;
use super::kv::KvStore;
use super::quota::Quota;
use super::runs::JobRuns;
use super::sessions::SessionTable;
use super::task_set::{Participating, TaskSet};
use crate::command::{CommandResult, Op, Output};
use crate::dispatcher::{DispatcherOp, DispatcherState};
use crate::error::{Code, OpError, RequestId};

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

/// What a write in one space must also fit in, outside the space.
#[derive(Default)]
pub(crate) struct Around<'a> {
    /// Bytes the rest of the ensemble holds.
    pub others: u64,
    /// The ensemble's quota, when the space is a named namespace (the default space's own quota
    /// is the ensemble's).
    pub ensemble: Option<&'a mut Quota>,
    /// The namespace's name, for refusals.
    pub namespace: Option<&'a str>,
    /// The most keys the space may hold (0: no limit).
    pub max_keys: u64,
}

/// Which bound refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The namespace's own limits.
    Own,
    /// The ensemble's quota.
    Ensemble,
}

/// `value`'s encoded size: what it takes in a snapshot.
fn encoded_len<T: Serialize>(value: &T) -> u64 {
    crate::codec::encoded_len(value)
}

/// One namespace's records. The default namespace's are encoded first in a snapshot, exactly as
/// the whole state was before namespaces (format 6).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Space {
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

impl Space {
    /// Applies one command: a retry gets its first answer, a write past a bound is refused (and
    /// raises that bound's alarm), and the result is remembered for retries.
    pub(crate) fn apply_command(
        &mut self,
        request: Option<&RequestId>,
        op: &Op,
        now_ms: u64,
        changes: &mut Vec<Change>,
        mut around: Around<'_>,
    ) -> CommandResult {
        if let Some(req) = request {
            if let Some(previous) = self.sessions.replay(req, now_ms) {
                return previous;
            }
        }
        let limits = around.namespace.map(|name| (name, around.max_keys));
        let refusal = self.refusal(op, around.others, around.ensemble.as_deref(), limits);
        let result = match refusal {
            Some((refusal, bound)) => {
                match (bound, around.ensemble.as_deref_mut()) {
                    (Bound::Ensemble, Some(ensemble)) => ensemble.alarm = true,
                    _ => self.quota.alarm = true,
                }
                Err(refusal)
            }
            None => self.apply_op(op, now_ms, changes),
        };
        // A refused command grew nothing (its session record is measured with the sessions).
        if result.is_ok() && grows_records(op) && self.quota.note_record_write(encoded_len(op)) {
            self.measure_records();
        }
        let total = self.usage() + around.others;
        match around.ensemble {
            // A namespace's own bound counts its own bytes; the ensemble's, everything.
            Some(ensemble) => {
                self.quota.settle(self.usage());
                ensemble.settle(total);
            }
            None => self.quota.settle(total),
        }
        // "Not set up yet" (or "queue empty" for a blocking pop) is a refusal to try again later,
        // not an outcome: remembering it would answer the retry with the same refusal forever.
        if let Some(req) = request.filter(|_| !matches!(&result, Err(e) if e.is_transient())) {
            self.sessions.record(req, &result);
        }
        result
    }

    /// Bytes the state counts against its quota.
    pub fn usage(&self) -> u64 {
        self.kv.bytes() + self.quota.records_bytes
    }

    /// How many bytes `op` would add to the space (0: it does not grow it).
    fn growth_of(&self, op: &Op) -> u64 {
        match op {
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
            _ => 0,
        }
    }

    /// How many keys `op` would create.
    fn new_keys_of(&self, op: &Op) -> u64 {
        match op {
            Op::KvPut { key, .. } | Op::KvIncrement { key, .. } => {
                u64::from(self.kv.get(key).is_none())
            }
            Op::Raw(raw) => self.kv.raw().new_keys_of(raw),
            _ => 0,
        }
    }

    /// Keys the space holds, path and raw.
    pub fn key_count(&self) -> u64 {
        self.kv.len() as u64 + self.kv.raw().key_count()
    }

    /// Why `op` is refused, if it would grow the space past a bound, and which bound. Apply
    /// refuses it and raises that bound's alarm; while an alarm is up, the leader refuses such
    /// writes before proposing them, so a writer past a bound cannot grow the Raft log either.
    ///
    /// `others` is what the rest of the ensemble holds; `ensemble` the ensemble's quota when this
    /// space is a named namespace (the default space's own quota is the ensemble's); `limits` the
    /// namespace's name and key limit.
    pub(crate) fn refusal(
        &self,
        op: &Op,
        others: u64,
        ensemble: Option<&Quota>,
        limits: Option<(&str, u64)>,
    ) -> Option<(OpError, Bound)> {
        let growth = self.growth_of(op);
        if growth == 0 {
            return None;
        }
        let what = || match op {
            Op::KvPut { key, .. } => format!("the put of key {key:?}"),
            Op::KvIncrement { key, .. } => format!("the increment of new key {key:?}"),
            Op::Dispatcher(d) => d.to_string(),
            other => other.to_string(),
        };
        let total = self.usage() + others;
        let Some(ensemble) = ensemble else {
            // The default space: its quota is the ensemble's.
            return self
                .quota
                .refusal(total, growth, what)
                .map(|e| (e, Bound::Ensemble));
        };
        if let Some((name, max_keys)) = limits {
            if let Some(e) = self
                .quota
                .namespace_refusal(name, self.usage(), growth, what)
            {
                return Some((e, Bound::Own));
            }
            let keys = self.key_count();
            let new = self.new_keys_of(op);
            if max_keys > 0 && new > 0 && keys + new > max_keys {
                return Some((
                    OpError::Status {
                        code: Code::ResourceExhausted,
                        message: format!(
                            "namespace {name:?} holds {keys} keys, its limit is {} (max_keys): {} would add {new} and is refused; delete keys or raise the limit",
                            max_keys,
                            what()
                        ),
                    },
                    Bound::Own,
                ));
            }
        }
        ensemble
            .refusal(total, growth, what)
            .map(|e| (e, Bound::Ensemble))
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
            Op::InNamespace { .. }
            | Op::DeclareNamespace { .. }
            | Op::DeleteNamespace { .. }
            | Op::ExpireNamespace { .. } => Err(OpError::Status {
                code: Code::InvalidArgument,
                message: format!("{op} is an op of the ensemble, not of one namespace"),
            }),
            op => {
                let at_barrier = match op {
                    Op::RegisterAtBarrier {
                        task, participants, ..
                    } => Some((task, Participating::Listed(participants))),
                    Op::RegisterAtBarrierOf {
                        task, participants, ..
                    } => Some((task, Participating::Runs(participants))),
                    _ => None,
                };
                if let (Some((task, participants)), Some(c)) = (at_barrier, self.cluster.as_ref()) {
                    c.check_register_barrier(task, &participants)?;
                }
                if let Op::RegisterTask { task, incarnation }
                | Op::RegisterRecoverableTask { task, incarnation }
                | Op::RegisterAtBarrier {
                    task, incarnation, ..
                }
                | Op::RegisterAtBarrierOf {
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
                let moved = c.tasks.settle();
                let changed: Vec<TaskName> = changes[before..]
                    .iter()
                    .filter_map(|ch| match ch {
                        Change::TaskChanged { task } => Some(task.clone()),
                        _ => None,
                    })
                    .collect();
                if !changed.is_empty() {
                    c.tasks_changed(changes, &moved);
                    self.runs
                        .after_task_changes(Some(c), &self.kv, changed.iter());
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
        } => c.register_at_barrier(
            task,
            *incarnation,
            &Participating::Listed(participants),
            now_ms,
            changes,
        ),
        Op::RegisterAtBarrierOf {
            task,
            incarnation,
            participants,
        } => c.register_at_barrier(
            task,
            *incarnation,
            &Participating::Runs(participants),
            now_ms,
            changes,
        ),
        Op::GetAliveTasks { source, tasks } => {
            c.get_alive_tasks(source, &TaskSet::of_tasks(tasks), changes)
        }
        Op::GetAliveTasksOf { source, tasks } => c.get_alive_tasks(source, tasks, changes),
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
        | Op::Raw(_)
        | Op::InNamespace { .. }
        | Op::DeclareNamespace { .. }
        | Op::DeleteNamespace { .. }
        | Op::ExpireNamespace { .. } => Err(OpError::Status {
            code: Code::Internal,
            message: format!("{op} reached the coordination dispatcher"),
        }),
    }
}

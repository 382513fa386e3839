//! The commands that travel through the Raft log, and what applying them returns.
//!
//! A command holds everything `apply` needs: the leader chose the time and any ids before it
//! proposed, so every replica computes the same result from the same log.
//!
//! Commands are spelled in the vocabulary of the modules below this one: the leaf `error`, the
//! dispatcher's updates, and the state's coordination records (`state::cluster`, `tasks`,
//! `barriers`, `alive`, none of which knows about commands). The state's apply, above this module,
//! consumes them.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::dispatcher::legacy::coord as legacy;
use crate::dispatcher::{DispatcherOp, DispatcherOutput};
use crate::error::Code;
use crate::raw::{RawOp, RawOutput};
use crate::state::alive::AliveAnswer;
use crate::state::barriers::Outcome;
use crate::state::cluster::{ClusterConfig, TaskName};
use crate::state::namespace_limits::NamespaceLimits;
use crate::state::task_set::TaskSet;
use crate::state::tasks::DeviceInfo;

// The outcome vocabulary lives in the leaf `error` module; these paths stay for callers.
pub use crate::error::{OpError, RequestId};

/// The payload of one Raft entry: a batch of commands proposed together.
///
/// The leader coalesces concurrent client writes into one proposal; they are applied in order, each
/// with its own result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Proposal {
    /// The leader's wall clock, in milliseconds since the Unix epoch, when it proposed. The only
    /// clock `apply` ever sees.
    pub proposed_at_ms: u64,
    pub commands: Vec<Command>,
}

impl Proposal {
    pub fn new(proposed_at_ms: u64, commands: Vec<Command>) -> Self {
        Self {
            proposed_at_ms,
            commands,
        }
    }
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "proposal@{}ms[", self.proposed_at_ms)?;
        for (i, c) in self.commands.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", c.op)?;
        }
        f.write_str("]")
    }
}

/// One client mutation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Identifies the request so that a retry (after a timeout or a leader change) is applied once.
    /// `None` only for commands the leader issues on its own behalf.
    pub request: Option<RequestId>,
    pub op: Op,
}

/// A state change. Keys are already normalized by the proposer (and normalized again by apply).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Insert `key`; if it exists, fail with `AlreadyExists` unless `overwrite`.
    KvPut {
        key: String,
        value: Bytes,
        overwrite: bool,
    },
    /// Delete `key` and every key under `key/`.
    KvDelete {
        key: String,
    },
    /// Add `delta` to the decimal integer stored at `key` (missing keys count as 0) and store the
    /// result as decimal ASCII.
    KvIncrement {
        key: String,
        delta: i64,
    },
    /// Sets up the coordinated job; ignored once set (the first leader proposes it).
    InitCluster {
        config: ClusterConfig,
        service_incarnation: u64,
    },
    RegisterTask {
        task: TaskName,
        incarnation: u64,
    },
    /// The task reports an error of its own (ReportErrorToService).
    ReportError {
        task: TaskName,
        code: Code,
        message: String,
    },
    /// The leader saw no heartbeat from the task, connected with `incarnation`, for `silent_ms`.
    HeartbeatTimeout {
        task: TaskName,
        incarnation: u64,
        silent_ms: u64,
    },
    ResetTask {
        task: TaskName,
    },
    ShutdownTask {
        task: TaskName,
    },
    WaitForAllTasks {
        task: TaskName,
        devices: DeviceInfo,
    },
    Barrier {
        id: String,
        counter: i64,
        /// Empty = every task of the cluster.
        tasks: Vec<TaskName>,
        timeout_ms: i64,
        source: TaskName,
    },
    CancelBarrier {
        id: String,
        counter: i64,
        source: TaskName,
    },
    /// The leader's clock passed the instance's deadline.
    ExpireBarrier {
        id: String,
        counter: i64,
    },
    /// Every pending barrier fails ABORTED.
    ShutdownService {
        reason: String,
    },
    /// Registers the task, then waits at the register barrier of `participants` (XLA's
    /// `cluster_register_with_barrier`): registration returns once they all registered.
    RegisterAtBarrier {
        task: TaskName,
        incarnation: u64,
        participants: Vec<TaskName>,
    },
    /// XLA's GetAliveTasks: `source` waits until every live task of `tasks` asked.
    GetAliveTasks {
        source: TaskName,
        tasks: Vec<TaskName>,
    },
    /// An update of coord's own dispatcher of before the two dispatchers became one: found in
    /// logs written then, applied through `DispatcherState::apply_legacy`, never proposed.
    LegacyDispatch(legacy::DispatchOp),
    /// An operator ends the job's current run (see `state::runs`). Appended last, as every new
    /// op must be: entries are encoded by variant index.
    EndRun {
        reason: String,
    },
    /// RegisterTask from a task that says it is recoverable (TF's `CoordinatedTask.recoverable`,
    /// set on every registration). A plain `RegisterTask` says it is not. Appended last.
    RegisterRecoverableTask {
        task: TaskName,
        incarnation: u64,
    },
    /// A dispatcher update (one journal entry), from either of its surfaces. (Logs of before the
    /// two dispatchers became one hold TensorFlow's updates here, with the same encoding.)
    Dispatcher(DispatcherOp),
    /// The leader's `--quota-bytes` (0: none), proposed when it differs from the state's (see
    /// `state::quota`). Appended last.
    SetQuota {
        bytes: u64,
    },
    /// A mutation of the raw key space (torch's store; see `crate::raw`). Appended last.
    Raw(RawOp),
    /// `op`, applied in the named namespace's world (see `state::namespaces`): the server wraps
    /// every command of a call bound to a namespace. Appended last.
    InNamespace {
        namespace: String,
        op: Box<Op>,
    },
    /// Creates the namespace with this shape and these limits, or confirms it exists with exactly
    /// them (a declaration that differs is refused, naming the differences). Appended last.
    DeclareNamespace {
        namespace: String,
        /// The namespace's job; no jobs: a namespace of keys only (torch's store).
        config: ClusterConfig,
        limits: NamespaceLimits,
        /// The incarnation its coordination service starts with (chosen by the leader).
        service_incarnation: u64,
    },
    /// Deletes the namespace and everything in it, in one entry. Appended last.
    DeleteNamespace {
        namespace: String,
    },
    /// The leader saw namespace `namespace` idle past its TTL since `idle_since_ms` (its last
    /// command) with no task connected: deleted, unless it was used since. Appended last.
    ExpireNamespace {
        namespace: String,
        idle_since_ms: u64,
    },
    /// `RegisterAtBarrier` with its participants as runs (see `state::task_set`): what the
    /// server proposes, so a job of N tasks registers in N entries of a few bytes, not N names
    /// each. Appended last.
    RegisterAtBarrierOf {
        task: TaskName,
        incarnation: u64,
        participants: TaskSet,
    },
    /// `GetAliveTasks` with its set as runs, likewise. Appended last.
    GetAliveTasksOf {
        source: TaskName,
        tasks: TaskSet,
    },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::KvPut {
                key,
                value,
                overwrite,
            } => write!(
                f,
                "put({key:?}, {} bytes, overwrite={overwrite})",
                value.len()
            ),
            Op::KvDelete { key } => write!(f, "delete({key:?})"),
            Op::KvIncrement { key, delta } => write!(f, "increment({key:?}, {delta})"),
            Op::InitCluster { config, .. } => {
                write!(f, "init_cluster({} tasks)", config.task_count())
            }
            Op::RegisterTask { task, incarnation } => {
                write!(f, "register({task}, {incarnation:#x})")
            }
            Op::ReportError { task, code, .. } => write!(f, "report_error({task}, {code:?})"),
            Op::HeartbeatTimeout { task, .. } => write!(f, "heartbeat_timeout({task})"),
            Op::ResetTask { task } => write!(f, "reset({task})"),
            Op::ShutdownTask { task } => write!(f, "shutdown({task})"),
            Op::WaitForAllTasks { task, .. } => write!(f, "wait_for_all_tasks({task})"),
            Op::Barrier {
                id,
                counter,
                source,
                ..
            } => write!(f, "barrier({id:?}#{counter}, {source})"),
            Op::CancelBarrier { id, counter, .. } => write!(f, "cancel_barrier({id:?}#{counter})"),
            Op::ExpireBarrier { id, counter } => write!(f, "expire_barrier({id:?}#{counter})"),
            Op::ShutdownService { .. } => write!(f, "shutdown_service"),
            Op::RegisterAtBarrier {
                task, incarnation, ..
            } => write!(f, "register_at_barrier({task}, {incarnation:#x})"),
            Op::GetAliveTasks { source, tasks } => {
                write!(f, "get_alive_tasks({source}, {} tasks)", tasks.len())
            }
            Op::LegacyDispatch(op) => write!(f, "dispatcher.{op}"),
            Op::EndRun { reason } => write!(f, "end_run({reason:?})"),
            Op::RegisterRecoverableTask { task, incarnation } => {
                write!(f, "register_recoverable({task}, {incarnation:#x})")
            }
            Op::Dispatcher(op) => write!(f, "dispatcher.{op}"),
            Op::SetQuota { bytes } => write!(f, "set_quota({bytes})"),
            Op::Raw(op) => write!(f, "raw.{op}"),
            Op::InNamespace { namespace, op } => write!(f, "ns({namespace:?}).{op}"),
            Op::DeclareNamespace {
                namespace, config, ..
            } => write!(
                f,
                "declare_namespace({namespace:?}, {} tasks)",
                config.task_count()
            ),
            Op::DeleteNamespace { namespace } => write!(f, "delete_namespace({namespace:?})"),
            Op::ExpireNamespace { namespace, .. } => write!(f, "expire_namespace({namespace:?})"),
            Op::RegisterAtBarrierOf {
                task, incarnation, ..
            } => write!(f, "register_at_barrier({task}, {incarnation:#x})"),
            Op::GetAliveTasksOf { source, tasks } => {
                write!(f, "get_alive_tasks({source}, {} tasks)", tasks.len())
            }
        }
    }
}

/// What applying one command produced. Failures here are deterministic outcomes of the command
/// (every replica reaches the same one), not storage errors.
pub type CommandResult = Result<Output, OpError>;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The command took effect and returns nothing.
    Done,
    /// The value the command left at its key (the new total of an increment).
    Value(Bytes),
    /// How many keys a delete removed.
    Deleted(u64),
    /// The task is registered with the service of this incarnation.
    Registered { service_incarnation: u64 },
    /// Where the caller's barrier instance stands: finished (`Some`) or still waiting.
    Barrier {
        counter: i64,
        outcome: Option<Outcome>,
    },
    /// The caller's GetAliveTasks round, and its answer if the round finished.
    Alive {
        generation: u64,
        answer: Option<AliveAnswer>,
    },
    /// What an update of coord's dispatcher of before returned (kept in session tables of
    /// snapshots written then).
    LegacyDispatch(legacy::DispatchOutput),
    /// What a dispatcher update returned.
    Dispatcher(DispatcherOutput),
    /// What a mutation of the raw key space returned. Appended last.
    Raw(RawOutput),
    /// A namespace declaration took effect: `created` if it made the namespace. Appended last.
    Declared {
        created: bool,
        service_incarnation: u64,
    },
}

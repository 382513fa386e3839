//! The coordination service's state transitions: registration, errors, barriers, shutdown.
//!
//! Every rule of TensorFlow's coordination service that decides an outcome lives here, as a pure
//! function of the state and the command, so all replicas reach the same outcome and a new leader
//! continues exactly where the old one stopped.
//!
//! This module holds [`Cluster`], the record the rules work on; the rules sit in submodules, each
//! an `impl Cluster` over one part of the service:
//!
//! - `task_lifecycle`: registration, reported errors, heartbeat timeouts, reset, ShutdownTask,
//!   WaitForAllTasks; a task in error fails the barriers it takes part in.
//! - `barrier_lifecycle`: Barrier, CancelBarrier, deadlines, the service's shutdown, and what
//!   happens when an instance finishes (the shutdown barrier disconnects or blames tasks).
//! - `xla`: XLA's additions: registration at a barrier, GetAliveTasks rounds, the WatchTasks
//!   version.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::alive::AliveQueries;
use super::barriers::{Barriers, Outcome};
use super::change::Change;
use super::cluster::{ClusterConfig, TaskName};
use super::tasks::{ErrorFeed, TaskRegistry};
use crate::command::{CommandResult, Output};
use crate::error::{Code, OpError};

mod barrier_lifecycle;
mod task_lifecycle;
mod xla;

/// Barrier ids the service uses itself; callers may not use this prefix.
pub const INTERNAL_BARRIER_PREFIX: &str = "coord-internal:";
/// The barrier behind WaitForAllTasks.
pub const WAIT_FOR_ALL_TASKS_BARRIER: &str = "coord-internal:wait_for_all_tasks";
/// The barrier behind ShutdownTask when a shutdown barrier timeout is configured.
pub const SHUTDOWN_BARRIER: &str = "coord-internal:shutdown";
/// The barrier XLA registrations wait at (RegisterAtBarrier).
pub const REGISTER_BARRIER: &str = "coord-internal:register";

/// The coordinated job, once the first leader has set it up.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub config: ClusterConfig,
    /// Chosen when the ensemble set the cluster up, and anew for every run of the job (see
    /// `runs`); the same on every replica, across leader changes.
    pub service_incarnation: u64,
    pub tasks: TaskRegistry,
    pub barriers: Barriers,
    pub errors: ErrorFeed,
    /// Open and recent GetAliveTasks rounds.
    pub alive: AliveQueries,
    /// Bumped whenever any task's record changes (XLA's WatchTasks version).
    pub task_version: u64,
    /// Tasks whose latest registration said they are recoverable (as TF sets it, per
    /// registration), beside the jobs `--recoverable-job` names. Last: snapshots of formats 1
    /// and 2 lack it.
    pub recoverable_tasks: BTreeSet<TaskName>,
}

fn status(code: Code, message: String) -> OpError {
    OpError::Status { code, message }
}

fn barrier_output(counter: i64, outcome: Option<Outcome>) -> CommandResult {
    Ok(Output::Barrier { counter, outcome })
}

impl Cluster {
    pub(crate) fn new(config: ClusterConfig, service_incarnation: u64) -> Self {
        Self {
            tasks: TaskRegistry::new(&config),
            config,
            service_incarnation,
            barriers: Barriers::default(),
            errors: ErrorFeed::default(),
            alive: AliveQueries::default(),
            task_version: 0,
            recoverable_tasks: BTreeSet::new(),
        }
    }

    /// Whether `task` is recoverable: its job is (`--recoverable-job`), or its latest
    /// registration said so. A recoverable task may register again with a new incarnation while
    /// connected or in error, and its errors are not propagated to the other tasks.
    pub fn is_recoverable(&self, task: &TaskName) -> bool {
        self.config.is_recoverable(task) || self.recoverable_tasks.contains(task)
    }

    /// A new run of the job (see `runs`): every task record, barrier instance and GetAliveTasks
    /// round of the last run goes; the error feed keeps its numbering, the task version its
    /// count, and the service takes `service_incarnation`.
    pub(crate) fn new_run(&mut self, service_incarnation: u64, changes: &mut Vec<Change>) {
        self.tasks = TaskRegistry::new(&self.config);
        self.barriers = Barriers::default();
        self.alive = AliveQueries::default();
        self.recoverable_tasks.clear();
        self.service_incarnation = service_incarnation;
        let tasks: Vec<TaskName> = self.config.all_tasks().collect();
        for task in tasks {
            changes.push(Change::TaskChanged { task });
        }
        // Every round went with the last run: no move to count.
        self.tasks_changed(changes, &[]);
    }

    fn require(&self, t: &TaskName) -> Result<(), OpError> {
        if self.config.contains(t) {
            Ok(())
        } else {
            Err(status(Code::InvalidArgument, self.config.why_unknown(t)))
        }
    }
}

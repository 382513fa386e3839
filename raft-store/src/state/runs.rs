//! Job runs: an ensemble outlives the jobs it serves.
//!
//! TensorFlow's and JAX's own coordination service lives and dies with its job, so every run of
//! a job starts from nothing. An ensemble serves the same job again and again; without runs, a
//! job started again found its tasks in ERROR (refused, ABORTED, forever), the previous run's keys
//! in place (ALREADY_EXISTS) and its barrier ids already passed (passing at once without
//! synchronising anything).
//!
//! So the state knows runs. A run begins at its first registration, and is over once every task
//! of the job has registered in it and none is connected any more (each disconnected, failed or
//! timed out): a job whose tasks did not all come never ends by itself, nor does one whose tasks
//! use barriers without registering (operators end those by hand). A task registering with a new
//! incarnation (a new process) while the run is over begins the next run: every task record,
//! barrier instance and GetAliveTasks round is cleared, the keys the previous run wrote are
//! deleted, and the service incarnation changes (as a new TF service process's would). What
//! survives: keys written while no run was in progress (an operator's configuration, for
//! example), the tf.data dispatcher, and the error feed's numbering. `EndRun` ends a run by hand
//! (and begins the next, which the job's tasks then register into).
//!
//! All of it is a pure function of the state: the next incarnation is derived from the last.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::change::Change;
use super::cluster::TaskName;
use super::coordination::Cluster;
use super::kv::KvStore;
use super::tasks::TaskState;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct JobRuns {
    /// The current (or last) run; 0 before the first registration.
    pub number: u64,
    /// The key-value revision when the run began: the keys it wrote have later revisions.
    pub opened_at: u64,
    /// The key-value revision when its last connected task left; `None` while a task is connected.
    pub over_at: Option<u64>,
    /// The tasks that have registered in this run.
    pub registered: BTreeSet<TaskName>,
}

impl JobRuns {
    /// The run a call made now belongs to. Calls before the first registration (barriers need
    /// none) belong to the first run: beginning it clears nothing.
    pub fn current(&self) -> u64 {
        self.number.max(1)
    }

    /// Whether the run is over: every one of the job's `tasks` came, and none is connected.
    pub fn is_over(&self, tasks: usize) -> bool {
        self.over_at.is_some() && self.registered.len() >= tasks
    }
}

impl JobRuns {
    /// Before `task` registers with `incarnation`: begins the first run, or the next one when the
    /// current run is over and `task` is a new process.
    pub(crate) fn before_registration(
        &mut self,
        cluster: Option<&mut Cluster>,
        kv: &mut KvStore,
        task: &TaskName,
        incarnation: u64,
        changes: &mut Vec<Change>,
    ) {
        let Some(c) = cluster else {
            return;
        };
        // The first run begins with its first registration that succeeds (`after_task_changes`).
        let new_process = c
            .tasks
            .get(task)
            .is_some_and(|r| r.incarnation != incarnation);
        let over = self.is_over(c.config.task_count());
        if self.number > 0 && over && new_process {
            self.begin_next_run(c, kv, changes);
        }
    }

    /// After the records of `changed` tasks changed: a run with no connected task is over (and
    /// one that has one again, for example a recoverable task coming back, is not).
    ///
    /// O(changed): a registration storm of N tasks, or N tasks leaving, must not cost N²
    /// (a task becomes connected only through a change of its own record, so the changed ones are
    /// the only ones to add to `registered`).
    pub(crate) fn after_task_changes<'a>(
        &mut self,
        cluster: Option<&Cluster>,
        kv: &KvStore,
        changed: impl Iterator<Item = &'a TaskName>,
    ) {
        let Some(c) = cluster else {
            return;
        };
        let is_connected = |t: &TaskName| {
            c.tasks
                .get(t)
                .is_some_and(|r| r.state == TaskState::Connected)
        };
        let connected: BTreeSet<TaskName> = changed.filter(|t| is_connected(t)).cloned().collect();
        if self.number == 0 {
            if !connected.is_empty() {
                *self = JobRuns {
                    number: 1,
                    opened_at: kv.revision(),
                    over_at: None,
                    registered: connected,
                };
            }
            return;
        }
        // Counted, not looked for: tasks that leave in task order would make each look walk
        // the ones that left before.
        let any_connected = !connected.is_empty() || c.tasks.count_in(TaskState::Connected) > 0;
        self.registered.extend(connected);
        if any_connected {
            self.over_at = None;
        } else if self.over_at.is_none() {
            self.over_at = Some(kv.revision());
        }
    }

    /// Ends the current run by hand and begins the next at once, with the same clean-up as when
    /// a job comes back; the job's tasks then register into it.
    pub(crate) fn end_run(
        &mut self,
        cluster: Option<&mut Cluster>,
        kv: &mut KvStore,
        changes: &mut Vec<Change>,
    ) {
        if let Some(c) = cluster {
            // Before any registration the first run is already under way (see `current`).
            self.number = self.current();
            self.begin_next_run(c, kv, changes);
        }
    }

    fn begin_next_run(&mut self, c: &mut Cluster, kv: &mut KvStore, changes: &mut Vec<Change>) {
        let written_until = self.over_at.unwrap_or_else(|| kv.revision());
        kv.remove_modified_in(self.opened_at, written_until, changes);
        let number = self.number + 1;
        c.new_run(next_incarnation(c.service_incarnation, number), changes);
        *self = JobRuns {
            number,
            opened_at: kv.revision(),
            over_at: None,
            registered: BTreeSet::new(),
        };
        changes.push(Change::RunStarted { number });
    }
}

// `apply`'s calls, over the parts of the state a run touches. They belong in `super`, beside
// `apply`: this is the only use of `CoordState` below it, and the one import circle left in the
// state (issue 37); they move there with the next change to `state/mod.rs`.
/// The service incarnation of run `number`, from the previous run's (splitmix64: a different,
/// well-mixed value every run; never 0, which clients read as "none").
fn next_incarnation(previous: u64, number: u64) -> u64 {
    let mut z = previous.wrapping_add(number.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

//! XLA's additions to the coordination service: registration at a barrier (RegisterAtBarrier),
//! GetAliveTasks rounds, and the task version WatchTasks follows.
//!
//! A GetAliveTasks round waits for every live task of its set and not for the dead: whenever a
//! task's record changes, the open rounds are checked again.

use super::{status, Cluster, REGISTER_BARRIER};
use crate::command::{CommandResult, Output};
use crate::error::{Code, OpError};
use crate::state::alive;
use crate::state::barriers::Participants;
use crate::state::change::Change;
use crate::state::cluster::TaskName;
use crate::state::task_set::{Participating, TaskSet};
use crate::state::tasks::Moved;

impl Cluster {
    /// After a command changed some task (the states of `moved`): a new WatchTasks version, and
    /// GetAliveTasks rounds that no longer wait for a task that died may finish.
    pub(crate) fn tasks_changed(&mut self, changes: &mut Vec<Change>, moved: &[Moved]) {
        self.task_version += 1;
        for (set, generation) in self.alive.recheck(&self.tasks, moved) {
            changes.push(Change::BarrierDone {
                id: alive::wait_key(&set),
                counter: generation as i64,
            });
        }
    }

    /// Refuses a registration at a register barrier of tasks outside the cluster, or one the task
    /// is not among: checked before anything of the registration is applied (a new run of the
    /// job begins with a registration, see `runs`).
    pub(crate) fn check_register_barrier(
        &self,
        task: &TaskName,
        participants: &Participating,
    ) -> Result<(), OpError> {
        if let Some(unknown) = participants.first_unknown(&self.config) {
            return Err(status(
                Code::InvalidArgument,
                self.config.why_unknown(&unknown),
            ));
        }
        if !participants.contains(task) {
            return Err(status(
                Code::InvalidArgument,
                format!("task {task} is not one of the tasks of the register barrier"),
            ));
        }
        Ok(())
    }

    /// XLA's registration: register, then wait at the register barrier of `participants`, which
    /// the caller checked first ([`Self::check_register_barrier`]).
    pub(crate) fn register_at_barrier(
        &mut self,
        task: &TaskName,
        incarnation: u64,
        participants: &Participating,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        // XLA's schema has no recoverable flag: its jobs are recoverable by `--recoverable-job`.
        self.register(task, incarnation, false, changes)?;
        let timeout = self.config.register_timeout_ms;
        let participants = match participants {
            Participating::Listed(list) => Participants::from_request(list),
            Participating::Runs(set) => Participants::from_set(set, &self.config),
        };
        self.arrive(
            REGISTER_BARRIER,
            0,
            participants,
            timeout,
            task,
            now_ms,
            changes,
        )
    }

    /// XLA's GetAliveTasks: joins the round of `tasks`.
    pub(crate) fn get_alive_tasks(
        &mut self,
        source: &TaskName,
        set: &TaskSet,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(source)?;
        if let Some(unknown) = set.first_unknown(&self.config) {
            return Err(status(
                Code::InvalidArgument,
                self.config.why_unknown(&unknown),
            ));
        }
        if !set.contains(source) {
            return Err(status(
                Code::InvalidArgument,
                format!("task {source} asked which tasks are alive, but it is not one of the tasks it asked about"),
            ));
        }
        let (generation, answer) = self.alive.ask(set, source, &self.tasks);
        if answer.is_some() {
            changes.push(Change::BarrierDone {
                id: alive::wait_key(set),
                counter: generation as i64,
            });
        }
        Ok(Output::Alive { generation, answer })
    }
}

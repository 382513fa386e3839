//! The task lifecycle: registration, reported errors, heartbeat timeouts, reset, ShutdownTask and
//! WaitForAllTasks.
//!
//! A task enters ERROR once and keeps its first error; entering it fails every barrier the task
//! takes part in and, unless its job is recoverable, tells the other tasks. A task that leaves
//! (reset, or shut down without a shutdown barrier) aborts the barriers it will not reach.

use super::{status, Cluster, SHUTDOWN_BARRIER, WAIT_FOR_ALL_TASKS_BARRIER};
use crate::command::{CommandResult, Output};
use crate::error::Code;
use crate::state::barriers::Participants;
use crate::state::change::Change;
use crate::state::cluster::TaskName;
use crate::state::tasks::{DeviceInfo, TaskError, TaskRecord, TaskState};

impl Cluster {
    /// Registers `task`; `recoverable` is what this registration says of it (TF sets the flag
    /// anew on every registration, before judging it).
    pub(crate) fn register(
        &mut self,
        task: &TaskName,
        incarnation: u64,
        recoverable: bool,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(task)?;
        let says = recoverable;
        let recoverable = says || self.config.is_recoverable(task);
        let registered = Ok(Output::Registered {
            service_incarnation: self.service_incarnation,
        });
        let Some(rec) = self.tasks.get_mut(task) else {
            return Err(status(Code::InvalidArgument, self.config.why_unknown(task)));
        };
        let result = match rec.state {
            TaskState::Connected if rec.incarnation == incarnation => registered,
            TaskState::Disconnected => {
                *rec = TaskRecord {
                    state: TaskState::Connected,
                    incarnation,
                    error: None,
                    devices: rec.devices.take(),
                    errors_seen_at_register: self.errors.last_seq(),
                };
                changes.push(Change::TaskChanged { task: task.clone() });
                registered
            }
            // As TensorFlow's service: a recoverable task reconnects over its old incarnation,
            // and out of ERROR too when that error is a lost connection (UNAVAILABLE: its
            // heartbeats stopped); any other error must be reset first.
            TaskState::Connected | TaskState::Error
                if recoverable
                    && (rec.state == TaskState::Connected
                        || rec
                            .error
                            .as_ref()
                            .is_some_and(|e| e.code == Code::Unavailable)) =>
            {
                rec.state = TaskState::Connected;
                rec.incarnation = incarnation;
                rec.error = None;
                rec.errors_seen_at_register = self.errors.last_seq();
                changes.push(Change::TaskChanged { task: task.clone() });
                registered
            }
            TaskState::Connected => {
                let message = format!(
                    "task {task} registered with incarnation {incarnation:#x} while it was connected with incarnation {:#x}: it restarted, and its job is not recoverable",
                    rec.incarnation
                );
                self.set_error(
                    task,
                    TaskError {
                        code: Code::Aborted,
                        message: message.clone(),
                        source: task.clone(),
                        reported: false,
                    },
                    changes,
                );
                Err(status(Code::Aborted, message))
            }
            TaskState::Error => {
                let why = rec
                    .error
                    .as_ref()
                    .map_or_else(String::new, |e| format!(": {}", e.message));
                Err(status(
                    Code::Aborted,
                    format!("task {task} is in error state{why}; reset it (ResetTask) before it registers again"),
                ))
            }
        };
        // What the registration said of the task holds once it is registered (a refused one
        // changes nothing).
        if result.is_ok() {
            if says {
                self.recoverable_tasks.insert(task.clone());
            } else {
                self.recoverable_tasks.remove(task);
            }
        }
        result
    }

    /// A task reported an error of its own (ReportErrorToService).
    pub(crate) fn report_error(
        &mut self,
        task: &TaskName,
        code: Code,
        message: &str,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(task)?;
        self.set_error(
            task,
            TaskError {
                code,
                message: message.to_string(),
                source: task.clone(),
                reported: true,
            },
            changes,
        );
        Ok(Output::Done)
    }

    /// The leader saw no heartbeat from `task` (connected with `incarnation`) for `silent_ms`.
    pub(crate) fn heartbeat_timeout(
        &mut self,
        task: &TaskName,
        incarnation: u64,
        silent_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(task)?;
        let still_same = self
            .tasks
            .get(task)
            .is_some_and(|r| r.state == TaskState::Connected && r.incarnation == incarnation);
        if still_same {
            self.set_error(task, TaskError {
                code: Code::Unavailable,
                message: format!(
                    "task {task} sent no heartbeat for {silent_ms} ms (timeout {} ms); it is considered dead",
                    self.config.heartbeat_timeout_ms
                ),
                source: task.clone(),
                reported: false,
            }, changes);
        }
        Ok(Output::Done)
    }

    /// Puts `task` in ERROR (keeping its first error), fails the barriers it takes part in, and
    /// tells the other tasks unless its job is recoverable.
    fn set_error(&mut self, task: &TaskName, error: TaskError, changes: &mut Vec<Change>) {
        let Some(rec) = self.tasks.get_mut(task) else {
            return;
        };
        if rec.state == TaskState::Error {
            return;
        }
        rec.state = TaskState::Error;
        rec.error = Some(error.clone());
        changes.push(Change::TaskChanged { task: task.clone() });
        for (id, counter) in self.barriers.pending_with(task, &self.config) {
            let message = format!(
                "barrier {id:?} failed: participant {task} is in error: {}",
                error.message
            );
            if self.barriers.fail(&id, counter, Code::Internal, message) {
                self.finished(&id, counter, changes);
            }
        }
        if !self.is_recoverable(task) {
            let seq = self.errors.push(error, None);
            changes.push(Change::ErrorRaised { seq });
        }
    }

    /// Disconnects a task in ERROR (or one whose agent went to ERROR on another task's error
    /// while the service still has it CONNECTED), so that it may register again.
    pub(crate) fn reset(&mut self, task: &TaskName, changes: &mut Vec<Change>) -> CommandResult {
        self.require(task)?;
        let state = self.tasks.get(task).map(|r| r.state);
        if state == Some(TaskState::Disconnected) {
            return Err(status(
                Code::FailedPrecondition,
                format!("task {task} is already disconnected; there is nothing to reset"),
            ));
        }
        if let Some(rec) = self.tasks.get_mut(task) {
            rec.error = None;
        }
        self.leave(task, "was reset", changes);
        Ok(Output::Done)
    }

    /// Disconnects `task` and aborts the barriers it takes part in (it will not arrive).
    fn leave(&mut self, task: &TaskName, why: &str, changes: &mut Vec<Change>) {
        self.disconnect(task, changes);
        for (id, counter) in self.barriers.pending_with(task, &self.config) {
            let message = format!("barrier {id:?} aborted: participant {task} {why}");
            if self.barriers.fail(&id, counter, Code::Aborted, message) {
                self.finished(&id, counter, changes);
            }
        }
    }

    pub(crate) fn shutdown_task(
        &mut self,
        task: &TaskName,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(task)?;
        let timeout = self.config.shutdown_barrier_timeout_ms;
        if timeout == 0 {
            self.leave(task, "shut down", changes);
            return Ok(Output::Done);
        }
        self.arrive(
            SHUTDOWN_BARRIER,
            0,
            Participants::All,
            timeout,
            task,
            now_ms,
            changes,
        )
    }

    pub(super) fn disconnect(&mut self, task: &TaskName, changes: &mut Vec<Change>) {
        if let Some(rec) = self.tasks.get_mut(task) {
            if rec.state != TaskState::Disconnected {
                rec.state = TaskState::Disconnected;
                changes.push(Change::TaskChanged { task: task.clone() });
            }
        }
    }

    pub(crate) fn wait_for_all(
        &mut self,
        task: &TaskName,
        devices: &DeviceInfo,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(task)?;
        let Some(rec) = self.tasks.get_mut(task) else {
            return Err(status(Code::InvalidArgument, self.config.why_unknown(task)));
        };
        if rec.state != TaskState::Connected {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "task {task} is not connected (it is {:?}); register it before WaitForAllTasks",
                    rec.state
                ),
            ));
        }
        rec.devices = Some(devices.clone());
        let timeout = self.config.register_timeout_ms;
        self.arrive(
            WAIT_FOR_ALL_TASKS_BARRIER,
            0,
            Participants::All,
            timeout,
            task,
            now_ms,
            changes,
        )
    }
}

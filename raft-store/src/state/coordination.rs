//! The coordination service's state transitions: registration, errors, barriers, shutdown.
//!
//! Every rule of TensorFlow's coordination service that decides an outcome lives here, as a pure
//! function of the state and the command, so all replicas reach the same outcome and a new leader
//! continues exactly where the old one stopped.

use serde::{Deserialize, Serialize};

use super::alive::{self, AliveQueries};
use super::barriers::{Arrival, Barriers, Outcome, Participants};
use super::change::Change;
use super::cluster::{list_tasks, ClusterConfig, TaskName};
use super::tasks::{DeviceInfo, ErrorFeed, TaskError, TaskRegistry, TaskState};
use crate::command::{CommandResult, Output};
use crate::error::{Code, OpError};

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
    /// Chosen once when the ensemble set the cluster up; the same on every replica, forever.
    pub service_incarnation: u64,
    pub tasks: TaskRegistry,
    pub barriers: Barriers,
    pub errors: ErrorFeed,
    /// Open and recent GetAliveTasks rounds.
    pub alive: AliveQueries,
    /// Bumped whenever any task's record changes (XLA's WatchTasks version).
    pub task_version: u64,
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
        }
    }

    /// After a command changed some task: a new WatchTasks version, and GetAliveTasks rounds
    /// that no longer wait for a task that died may finish.
    pub(crate) fn tasks_changed(&mut self, changes: &mut Vec<Change>) {
        self.task_version += 1;
        for (set, generation) in self.alive.recheck(&self.tasks) {
            changes.push(Change::BarrierDone {
                id: alive::wait_key(&set),
                counter: generation as i64,
            });
        }
    }

    /// XLA's registration: register, then wait at the register barrier of `participants`.
    pub(crate) fn register_at_barrier(
        &mut self,
        task: &TaskName,
        incarnation: u64,
        participants: &[TaskName],
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if let Some(unknown) = participants.iter().find(|t| !self.config.contains(t)) {
            return Err(status(
                Code::InvalidArgument,
                self.config.why_unknown(unknown),
            ));
        }
        if !participants.contains(task) {
            return Err(status(
                Code::InvalidArgument,
                format!("task {task} is not one of the tasks of the register barrier"),
            ));
        }
        self.register(task, incarnation, changes)?;
        let timeout = self.config.register_timeout_ms;
        self.arrive(
            REGISTER_BARRIER,
            0,
            Participants::from_request(participants),
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
        tasks: &[TaskName],
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(source)?;
        if let Some(unknown) = tasks.iter().find(|t| !self.config.contains(t)) {
            return Err(status(
                Code::InvalidArgument,
                self.config.why_unknown(unknown),
            ));
        }
        let set = alive::set_key(tasks);
        if !set.contains(source) {
            return Err(status(
                Code::InvalidArgument,
                format!("task {source} asked which tasks are alive, but it is not one of the tasks it asked about"),
            ));
        }
        let (generation, answer) = self.alive.ask(set.clone(), source, &self.tasks);
        if answer.is_some() {
            changes.push(Change::BarrierDone {
                id: alive::wait_key(&set),
                counter: generation as i64,
            });
        }
        Ok(Output::Alive { generation, answer })
    }

    fn require(&self, t: &TaskName) -> Result<(), OpError> {
        if self.config.contains(t) {
            Ok(())
        } else {
            Err(status(Code::InvalidArgument, self.config.why_unknown(t)))
        }
    }

    pub(crate) fn register(
        &mut self,
        task: &TaskName,
        incarnation: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        self.require(task)?;
        let recoverable = self.config.is_recoverable(task);
        let registered = Ok(Output::Registered {
            service_incarnation: self.service_incarnation,
        });
        let Some(rec) = self.tasks.get_mut(task) else {
            return Err(status(Code::InvalidArgument, self.config.why_unknown(task)));
        };
        match rec.state {
            TaskState::Connected if rec.incarnation == incarnation => registered,
            TaskState::Disconnected => {
                *rec = super::tasks::TaskRecord {
                    state: TaskState::Connected,
                    incarnation,
                    error: None,
                    devices: rec.devices.take(),
                    errors_seen_at_register: self.errors.last_seq(),
                };
                changes.push(Change::TaskChanged { task: task.clone() });
                registered
            }
            TaskState::Connected | TaskState::Error if recoverable => {
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
        }
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
        if !self.config.is_recoverable(task) {
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

    fn disconnect(&mut self, task: &TaskName, changes: &mut Vec<Change>) {
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

    /// A caller's Barrier request.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn barrier(
        &mut self,
        id: &str,
        counter: i64,
        tasks: &[TaskName],
        timeout_ms: i64,
        source: &TaskName,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if id.is_empty() {
            return Err(status(
                Code::InvalidArgument,
                "barrier id must not be empty".into(),
            ));
        }
        if id.starts_with(INTERNAL_BARRIER_PREFIX) {
            return Err(status(
                Code::InvalidArgument,
                format!("barrier id {id:?} uses the reserved prefix {INTERNAL_BARRIER_PREFIX:?}"),
            ));
        }
        let timeout = u64::try_from(timeout_ms).map_err(|_| {
            status(
                Code::InvalidArgument,
                format!("barrier {id:?}: timeout {timeout_ms} ms is negative"),
            )
        })?;
        if counter < 0 {
            return Err(status(
                Code::InvalidArgument,
                format!("barrier {id:?}: counter {counter} is negative"),
            ));
        }
        self.require(source)?;
        if let Some(unknown) = tasks.iter().find(|t| !self.config.contains(t)) {
            // The barrier fails for everyone, as TensorFlow's does.
            let message = format!("barrier {id:?}: {}", self.config.why_unknown(unknown));
            return self.fail_request(id, counter, Code::InvalidArgument, message, changes);
        }
        self.arrive(
            id,
            counter,
            Participants::from_request(tasks),
            timeout,
            source,
            now_ms,
            changes,
        )
    }

    /// Fails instance `counter` of `id` on a bad request, creating it if needed, so every caller
    /// of that instance gets the same error.
    #[allow(clippy::too_many_arguments)]
    fn fail_request(
        &mut self,
        id: &str,
        counter: i64,
        code: Code,
        message: String,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        match self.barriers.fail_or_create(id, counter, code, message) {
            Ok((outcome, newly_failed)) => {
                if newly_failed {
                    self.finished(id, counter, changes);
                }
                barrier_output(counter, Some(outcome))
            }
            Err((code, message)) => Err(status(code, message)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn arrive(
        &mut self,
        id: &str,
        counter: i64,
        participants: Participants,
        timeout_ms: u64,
        source: &TaskName,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        let before = self.barriers.get(id).map(|b| (b.counter, b.is_pending()));
        let new_instance = match before {
            None => true,
            Some((c, pending)) => counter == c + 1 && !pending,
        };
        // Whether an outcome after this arrival is news (and not a stored answer).
        let fresh = new_instance || before == Some((counter, true));
        let arrival = self.barriers.arrive(
            id,
            counter,
            participants,
            timeout_ms,
            source,
            now_ms,
            &self.config,
        );
        match arrival {
            Arrival::Rejected { code, message } => Err(status(code, message)),
            Arrival::Done { counter, outcome } => {
                if fresh {
                    self.finished(id, counter, changes);
                }
                barrier_output(counter, Some(outcome))
            }
            Arrival::Waiting { counter } => {
                if new_instance {
                    let deadline_ms = self.barriers.get(id).and_then(|rec| rec.deadline_ms);
                    changes.push(Change::BarrierStarted {
                        id: id.to_string(),
                        counter,
                        deadline_ms,
                    });
                    // A participant already in error dooms the instance from the start (later
                    // errors fail it through `set_error`, so arrivals need not look again).
                    let in_error = self.barriers.get(id).and_then(|rec| {
                        rec.participants.iter(&self.config).find(|t| {
                            self.tasks
                                .get(t)
                                .is_some_and(|r| r.state == TaskState::Error)
                        })
                    });
                    if let Some(bad) = in_error {
                        let message =
                            format!("barrier {id:?} failed: participant {bad} is in error");
                        self.barriers.fail(id, counter, Code::Internal, message);
                        self.finished(id, counter, changes);
                        let outcome = self.barriers.get(id).and_then(|b| b.outcome.clone());
                        return barrier_output(counter, outcome);
                    }
                }
                barrier_output(counter, None)
            }
        }
    }

    /// Side effects of an instance that just finished, and the change that wakes its waiters.
    /// Called once per instance, on the transition to finished.
    fn finished(&mut self, id: &str, counter: i64, changes: &mut Vec<Change>) {
        if id == SHUTDOWN_BARRIER {
            self.after_shutdown_barrier(changes);
        }
        changes.push(Change::BarrierDone {
            id: id.to_string(),
            counter,
        });
    }

    /// Tasks at the shutdown barrier disconnect whatever its outcome; when it failed, those that
    /// did not reach it are put in error and told.
    fn after_shutdown_barrier(&mut self, changes: &mut Vec<Change>) {
        let Some(rec) = self.barriers.get(SHUTDOWN_BARRIER) else {
            return;
        };
        let arrived: Vec<TaskName> = rec.arrived.iter().cloned().collect();
        let failure = match &rec.outcome {
            Some(Outcome::Failed { message, .. }) => Some(message.clone()),
            _ => None,
        };
        let missing: Vec<TaskName> = rec.missing(&self.config).collect();
        for t in &arrived {
            self.disconnect(t, changes);
        }
        let Some(why) = failure else { return };
        if missing.is_empty() {
            return;
        }
        let message = format!(
            "the shutdown barrier failed before these tasks reached it: {} ({why})",
            list_tasks(&missing, 10)
        );
        for t in &missing {
            if let Some(r) = self.tasks.get_mut(t) {
                if r.state == TaskState::Connected {
                    r.state = TaskState::Error;
                    r.error = Some(TaskError {
                        code: Code::DeadlineExceeded,
                        message: message.clone(),
                        source: t.clone(),
                        reported: false,
                    });
                    changes.push(Change::TaskChanged { task: t.clone() });
                }
            }
        }
        let first = missing[0].clone();
        let seq = self.errors.push(
            TaskError {
                code: Code::DeadlineExceeded,
                message,
                source: first,
                reported: false,
            },
            Some(missing.into_iter().collect()),
        );
        changes.push(Change::ErrorRaised { seq });
    }

    pub(crate) fn cancel_barrier(
        &mut self,
        id: &str,
        counter: i64,
        source: &TaskName,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if id.is_empty() {
            return Err(status(
                Code::InvalidArgument,
                "barrier id must not be empty".into(),
            ));
        }
        self.require(source)?;
        match self.barriers.cancel(id, counter, source) {
            Ok(true) => {
                self.finished(id, counter, changes);
                Ok(Output::Done)
            }
            Ok(false) => Ok(Output::Done),
            Err((code, message)) => Err(status(code, message)),
        }
    }

    /// The leader's clock says instance `counter` of `id` is past its deadline.
    pub(crate) fn expire_barrier(
        &mut self,
        id: &str,
        counter: i64,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        if self.barriers.expire(id, counter, now_ms, &self.config) {
            self.finished(id, counter, changes);
        }
        Ok(Output::Done)
    }

    /// Every pending barrier fails ABORTED: the service is going away.
    pub(crate) fn shutdown_service(
        &mut self,
        reason: &str,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        let pending: Vec<(String, i64)> = self
            .barriers
            .pending()
            .map(|b| (b.id.clone(), b.counter))
            .collect();
        for (id, counter) in pending {
            let message = format!(
                "barrier {id:?} aborted: the coordination service is shutting down ({reason})"
            );
            if self.barriers.fail(&id, counter, Code::Aborted, message) {
                self.finished(&id, counter, changes);
            }
        }
        Ok(Output::Done)
    }
}

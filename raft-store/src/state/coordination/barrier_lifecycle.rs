//! Barriers: the Barrier and CancelBarrier calls, deadlines, the service's shutdown, and what
//! happens when an instance finishes.
//!
//! An instance finishes once: `finished` runs on that transition only, so the change that wakes
//! its waiters, and the shutdown barrier's side effects, happen once however often callers arrive
//! or retry.

use super::{barrier_output, status, Cluster, INTERNAL_BARRIER_PREFIX, SHUTDOWN_BARRIER};
use crate::command::{CommandResult, Output};
use crate::error::Code;
use crate::state::barriers::{Arrival, Outcome, Participants};
use crate::state::change::Change;
use crate::state::cluster::{list_tasks, TaskName};
use crate::state::tasks::{TaskError, TaskState};

impl Cluster {
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
    pub(super) fn arrive(
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
    pub(super) fn finished(&mut self, id: &str, counter: i64, changes: &mut Vec<Change>) {
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

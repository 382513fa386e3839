//! Round-robin reads (`num_consumers`): every consumer reads round r from task r mod n, so they
//! must agree on when a task joins or leaves.
//!
//! A task made while consumers read (a worker joined) is pending: it aims at a target round, and
//! each consumer, on its heartbeat, either accepts it (it has blocked before that round) or
//! rejects it (it already reads that round or later), which clears the acceptances and aims at a
//! later round, doubling the distance each time (the protocol described in the comments of
//! TensorFlow's `DataServiceDispatcherImpl`). When every consumer accepted, the task becomes
//! readable from the target round on. coord's consumers follow the same protocol.
//!
//! A task leaves by MaybeRemoveTask, once every consumer asked to remove it at the same round
//! (that agreement is gathered in the leader's memory); it is then forgotten. (coord's round-robin
//! tasks leave only with their worker's death.)

use super::errors::status;
use super::{DispatcherOutput, DispatcherState};
use crate::error::{Code, OpError};

impl DispatcherState {
    pub(super) fn client_heartbeat(
        &mut self,
        client: i64,
        current_round: Option<i64>,
        blocked_round: Option<i64>,
        client_round: i64,
    ) -> Result<DispatcherOutput, OpError> {
        let iteration = self.client_iteration(client)?.id;
        let consumers = self
            .iterations
            .get(&iteration)
            .and_then(|it| self.jobs.get(&it.job))
            .and_then(|j| j.num_consumers);
        let Some(it) = self.iterations.get_mut(&iteration) else {
            return Ok(DispatcherOutput::Done);
        };
        let Some(front) = it.pending.front_mut() else {
            return Ok(DispatcherOutput::Done);
        };
        // Both decided on the task as it stands before this heartbeat, as TF's dispatcher does.
        let rejected = current_round.unwrap_or(0) >= front.target_round;
        let accepted = blocked_round.is_some_and(|b| b <= front.target_round)
            && !front.ready.contains(&client);
        if rejected {
            let offset = 2i64
                .checked_shl(front.failures)
                .filter(|o| *o > 0)
                .unwrap_or(i64::MAX);
            front.failures = front.failures.saturating_add(1);
            front.ready.clear();
            front.target_round = client_round.saturating_add(offset);
        }
        if accepted {
            front.ready.insert(client);
            let all = consumers.and_then(|n| usize::try_from(n).ok());
            if all == Some(front.ready.len()) {
                let (task, round) = (front.task, front.target_round);
                it.pending.pop_front();
                it.tasks.push(task);
                if let Some(t) = self.tasks.get_mut(&task) {
                    t.starting_round = round;
                }
            }
        }
        Ok(DispatcherOutput::Done)
    }

    pub(super) fn remove_task(&mut self, task_id: i64) -> Result<DispatcherOutput, OpError> {
        // Already removed: TF answers `removed` without an update.
        let Some(task) = self.tasks.get(&task_id) else {
            return Ok(DispatcherOutput::Done);
        };
        let (iteration, worker) = (task.iteration, task.worker.clone());
        let round_robin = self
            .iterations
            .get(&iteration)
            .is_some_and(|it| self.is_round_robin(it.job));
        if !round_robin {
            return Err(status(
                Code::FailedPrecondition,
                "MaybeRemoveTask called on a non-round-robin task.".into(),
            ));
        }
        self.tasks.remove(&task_id);
        if let Some(it) = self.iterations.get_mut(&iteration) {
            it.tasks.retain(|t| *t != task_id);
            it.pending.retain(|p| p.task != task_id);
        }
        if let Some(w) = self.workers.get_mut(&worker) {
            w.tasks.remove(&task_id);
        }
        Ok(DispatcherOutput::Done)
    }
}

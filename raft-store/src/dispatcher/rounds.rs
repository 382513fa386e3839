//! Round-robin reads: adding a task mid-job so that every consumer starts reading it in the same
//! round (the pending-task protocol described in the comments of TensorFlow's tf.data dispatcher,
//! `DataServiceDispatcherImpl`).
//!
//! A new task waits in its job's pending queue with a target round. Consumers heartbeat their
//! current round and the round they have blocked before; the dispatcher tells each to block
//! before the target. A consumer already at or past the target makes the target fail: the delta
//! doubles and the target moves past that consumer. Once every consumer has blocked at or before
//! the target, the task gets `starting_round = target` and consumers see it.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{not_found, status, DispatchOutput, DispatcherState};
use crate::error::{Code, OpError};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct PendingTask {
    pub task: u64,
    pub target_round: i64,
    pub delta: i64,
    /// Consumers blocked at or before the target.
    pub ready: BTreeSet<u64>,
}

impl PendingTask {
    /// A pending task aimed one round past `latest_round`, the latest round the leader heard of.
    pub fn new(task: u64, latest_round: i64) -> Self {
        Self {
            task,
            target_round: latest_round.saturating_add(1),
            delta: 1,
            ready: BTreeSet::new(),
        }
    }
}

impl DispatcherState {
    pub(super) fn client_rounds(
        &mut self,
        client: u64,
        current: Option<i64>,
        blocked: Option<i64>,
    ) -> Result<DispatchOutput, OpError> {
        let Some(&job_id) = self.clients.get(&client) else {
            return Err(not_found("job client", client));
        };
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Err(not_found("job", job_id));
        };
        let Some(consumers) = job.num_consumers else {
            return Err(status(
                Code::FailedPrecondition,
                format!("job {job_id} of client {client} does not read round-robin"),
            ));
        };
        let Some(p) = job.pending.front_mut() else {
            return Ok(DispatchOutput::Block(None));
        };
        let current = current.unwrap_or(0);
        if current >= p.target_round {
            // Too late for this consumer to block the target: aim further out.
            p.delta = p.delta.saturating_mul(2);
            p.target_round = current.saturating_add(p.delta);
            p.ready.clear();
            return Ok(DispatchOutput::Block(Some(p.target_round)));
        }
        if blocked.is_some_and(|b| b <= p.target_round) {
            p.ready.insert(client);
        }
        if (p.ready.len() as u64) < consumers {
            return Ok(DispatchOutput::Block(Some(p.target_round)));
        }
        let (task, round) = (p.task, p.target_round);
        job.pending.pop_front();
        let next = job.pending.front().map(|n| n.target_round.max(round + 1));
        if let Some(n) = job.pending.front_mut() {
            n.target_round = n.target_round.max(round + 1);
        }
        if let Some(t) = self.tasks.get_mut(&task) {
            t.starting_round = Some(round);
        }
        Ok(DispatchOutput::Block(next))
    }
}

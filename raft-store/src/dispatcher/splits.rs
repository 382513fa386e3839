//! DYNAMIC sharding ("distributed epoch"): a provider hands out its splits in order, one
//! repetition after another; where workers report delivery, each split is leased.
//!
//! TensorFlow's workers ask for the next split of (iteration, repetition, provider); coord-proxy
//! may ask for several at once (a lease it hands out to its host's workers, one per GetSplit).
//! Past the last split the answer is end-of-splits and the provider moves to the next repetition
//! (a worker that repeats its input asks for it). A request for a repetition already over
//! answers end-of-splits and changes nothing; one for a later repetition (an input repeated
//! before it ended, e.g. the longer side of a `zip`) starts that repetition, as TensorFlow resets
//! its provider then. A split handed to a TensorFlow worker is gone, as in TensorFlow.
//!
//! coord's data workers ask by task, and report the splits whose elements they delivered: a split
//! stays leased to its task until then, and the leases of a worker declared dead are handed out
//! again, ahead of new splits. A definition numbers its splits across epochs (repetition 0).
//!
//! Every split handed out is an applied op, so a new leader never hands it out again, and a
//! retried request (same request id) is answered from the session table with what it was first
//! given.

use std::collections::BTreeSet;

use super::errors::{iteration_not_found, not_known, status};
use super::{sharding, DispatcherOutput, DispatcherState, LeaseAnswer, Leases, Provider};
use crate::error::{Code, OpError};

impl Provider {
    /// Up to `max` (at least one) next splits of the current repetition: `from..from + count`.
    fn take(&mut self, max: u64) -> (u64, u64) {
        let (from, count) = (self.index, (self.splits - self.index).min(max.max(1)));
        self.index += count;
        (from, count)
    }

    /// Every split handed out and, where leased, delivered.
    pub fn exhausted(&self) -> bool {
        self.index >= self.splits
            && self
                .leases
                .as_ref()
                .is_none_or(|l| l.leased.is_empty() && l.reissue.is_empty())
    }

    /// Leases up to `max` (at least one) splits to `task`: re-issued ones first, then new ones.
    /// Returns the splits and how many of them were new.
    fn lease(&mut self, task: i64, max: u32) -> (LeaseAnswer, u64) {
        let want = max.max(1) as usize;
        let Some(leases) = self.leases.as_mut() else {
            return (LeaseAnswer::EndOfSplits, 0);
        };
        let mut got = Vec::new();
        while got.len() < want {
            let Some(s) = leases.reissue.pop_first() else {
                break;
            };
            leases.reissued += 1;
            got.push(s);
        }
        let mut fresh = 0;
        if got.len() < want && self.index < self.splits {
            let (from, count) = (
                self.index,
                (self.splits - self.index).min((want - got.len()) as u64),
            );
            self.index += count;
            fresh = count;
            got.extend(from..from + count);
        }
        for s in &got {
            leases.leased.insert(*s, task);
        }
        let answer = if !got.is_empty() {
            LeaseAnswer::Splits(got)
        } else if leases.leased.values().any(|t| *t != task) {
            LeaseAnswer::Retry
        } else {
            LeaseAnswer::EndOfSplits
        };
        (answer, fresh)
    }

    /// Ends the leases `task` holds on `done`; others' leases and unknown splits are ignored (a
    /// late report after the split went to someone else).
    fn deliver(&mut self, task: i64, done: &[u64]) {
        let Some(leases) = self.leases.as_mut() else {
            return;
        };
        for s in done {
            if leases.leased.get(s) == Some(&task) {
                leases.leased.remove(s);
                leases.delivered += 1;
            }
        }
    }

    /// The task's worker died: its leases go back to be handed out first.
    pub(super) fn revoke(&mut self, task: i64) {
        let Some(Leases {
            leased, reissue, ..
        }) = self.leases.as_mut()
        else {
            return;
        };
        let lost: Vec<u64> = leased
            .iter()
            .filter(|(_, t)| **t == task)
            .map(|(s, _)| *s)
            .collect();
        for s in lost {
            leased.remove(&s);
            reissue.insert(s);
        }
    }
}

impl DispatcherState {
    pub(super) fn get_split(
        &mut self,
        iteration: i64,
        repetition: i64,
        provider: i64,
        max: u64,
    ) -> Result<DispatcherOutput, OpError> {
        let it = self
            .iterations
            .get_mut(&iteration)
            .ok_or_else(|| iteration_not_found(iteration))?;
        let Some(providers) = it.providers.as_mut() else {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "Cannot get split for iteration {iteration}, since it is not a \
                     distributed_epoch iteration."
                ),
            ));
        };
        let count = providers.len();
        let p = usize::try_from(provider)
            .ok()
            .and_then(|i| providers.get_mut(i))
            .ok_or_else(|| {
                status(
                    Code::InvalidArgument,
                    format!(
                        "split provider index {provider} is out of range: iteration \
                         {iteration} has {count} split providers"
                    ),
                )
            })?;
        if p.leases.is_some() {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "iteration {iteration} reads a coord dataset definition: its splits are \
                     leased to coord's data workers by task"
                ),
            ));
        }
        let end = DispatcherOutput::Splits { from: 0, count: 0 };
        if repetition < p.repetition {
            return Ok(end);
        }
        if repetition > p.repetition {
            p.repetition = repetition;
            p.index = 0;
        }
        if p.index < p.splits {
            let (from, count) = p.take(max);
            self.splits_handed_out += count;
            Ok(DispatcherOutput::Splits { from, count })
        } else {
            p.repetition += 1;
            p.index = 0;
            Ok(end)
        }
    }

    /// coord's GetSplit: the task reports what it delivered and leases up to `max` splits.
    pub(super) fn lease_splits(
        &mut self,
        task_id: i64,
        done: &[u64],
        max: u32,
    ) -> Result<DispatcherOutput, OpError> {
        let Some(task) = self.tasks.get(&task_id) else {
            return Err(not_known("task", task_id));
        };
        if task.removed {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "task {task_id} was removed (its worker {} was declared dead or its job was \
                     collected); its splits go to other workers",
                    task.worker
                ),
            ));
        }
        let iteration = task.iteration;
        let it = self
            .iterations
            .get(&iteration)
            .ok_or_else(|| not_known("job", iteration))?;
        let dynamic = self
            .jobs
            .get(&it.job)
            .is_some_and(|j| j.sharding == sharding::DYNAMIC);
        let leased = it
            .providers
            .as_ref()
            .and_then(|p| p.first())
            .is_some_and(|p| p.leases.is_some());
        if !dynamic || !leased {
            let mode = self.jobs.get(&it.job).map_or(-1, |j| j.sharding);
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "task {task_id} belongs to job {iteration}, whose processing mode is {}, not \
                     DYNAMIC over a coord definition: it has no splits to lease",
                    sharding::name(mode)
                ),
            ));
        }
        let finished = it.finished;
        let Some(p) = self
            .iterations
            .get_mut(&iteration)
            .and_then(|it| it.providers.as_mut())
            .and_then(|p| p.first_mut())
        else {
            return Err(not_known("job", iteration));
        };
        p.deliver(task_id, done);
        let answer = if finished {
            LeaseAnswer::EndOfSplits
        } else {
            let (answer, fresh) = p.lease(task_id, max);
            self.splits_handed_out += fresh;
            answer
        };
        if answer == LeaseAnswer::EndOfSplits {
            self.maybe_finish(iteration);
        }
        Ok(DispatcherOutput::Lease(answer))
    }

    /// coord's WorkerUpdate: splits delivered and tasks finished, reported by their worker.
    pub(super) fn report_delivery(
        &mut self,
        address: &str,
        done: &[(i64, u64)],
        completed: &[i64],
    ) -> Result<DispatcherOutput, OpError> {
        if !self.workers.contains_key(address) {
            return Err(status(
                Code::NotFound,
                format!("worker {address} is not registered with the dispatcher"),
            ));
        }
        for task in done.iter().map(|(t, _)| t).chain(completed) {
            match self.tasks.get(task) {
                None => return Err(not_known("task", task)),
                Some(t) if t.worker != address => {
                    return Err(status(
                        Code::InvalidArgument,
                        format!("task {task} runs on worker {}, not on {address}", t.worker),
                    ))
                }
                Some(_) => {}
            }
        }
        let mut iterations = BTreeSet::new();
        for (task, split) in done {
            let Some(iteration) = self.tasks.get(task).map(|t| t.iteration) else {
                continue;
            };
            if let Some(it) = self.iterations.get_mut(&iteration) {
                for p in it.providers.iter_mut().flatten() {
                    p.deliver(*task, &[*split]);
                }
            }
            iterations.insert(iteration);
        }
        for task in completed {
            let Some(t) = self.tasks.get_mut(task) else {
                continue;
            };
            if !t.finished {
                t.finished = true;
                let (worker, iteration) = (t.worker.clone(), t.iteration);
                if let Some(w) = self.workers.get_mut(&worker) {
                    w.tasks.remove(task);
                }
                iterations.insert(iteration);
            }
        }
        for it in iterations {
            self.maybe_finish(it);
        }
        Ok(DispatcherOutput::Done)
    }
}

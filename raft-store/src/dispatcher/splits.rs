//! DYNAMIC sharding: splits handed out on demand, each leased to the task it went to.
//!
//! The provider is a counter (split `i` is a pure function of the dataset definition and `i`), so
//! restoring it is O(1) where TF fast-forwards a split provider one `GetNext` per split already
//! handed out. A lease ends when the task reports the split's elements delivered; a lease held
//! by a worker declared dead goes back to be handed out again.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{not_found, status, DispatchOutput, DispatcherState, Mode};
use crate::error::{Code, OpError};

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SplitProvider {
    /// The next split never handed out.
    pub next: u64,
    /// Splits in all epochs; `None` = forever.
    pub total: Option<u64>,
    /// Split -> the task it is leased to.
    pub leased: BTreeMap<u64, u64>,
    /// Splits whose worker died before delivering them, handed out first.
    pub reissue: BTreeSet<u64>,
    /// Splits delivered.
    pub delivered: u64,
    /// Splits handed out again after their worker died.
    pub reissued: u64,
}

/// What GetSplit answers.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum SplitAnswer {
    /// One or more splits, now leased to the task.
    Splits(Vec<u64>),
    /// Nothing now, but leases held by other tasks may come back.
    Retry,
    EndOfSplits,
}

impl SplitProvider {
    pub fn new(total: Option<u64>) -> Self {
        Self {
            next: 0,
            total,
            leased: BTreeMap::new(),
            reissue: BTreeSet::new(),
            delivered: 0,
            reissued: 0,
        }
    }

    /// Every split handed out and delivered.
    pub fn exhausted(&self) -> bool {
        self.total.is_some_and(|t| self.next >= t)
            && self.leased.is_empty()
            && self.reissue.is_empty()
    }

    /// Leases up to `max` splits to `task`: re-issued ones first, then new ones.
    fn take(&mut self, task: u64, max: u32) -> SplitAnswer {
        let mut got = Vec::new();
        while got.len() < max.max(1) as usize {
            let split = if let Some(s) = self.reissue.pop_first() {
                self.reissued += 1;
                s
            } else if self.total.is_none_or(|t| self.next < t) {
                self.next += 1;
                self.next - 1
            } else {
                break;
            };
            self.leased.insert(split, task);
            got.push(split);
        }
        if !got.is_empty() {
            SplitAnswer::Splits(got)
        } else if self.leased.values().any(|t| *t != task) {
            SplitAnswer::Retry
        } else {
            SplitAnswer::EndOfSplits
        }
    }

    /// Ends the leases `task` holds on `done`; others' leases and unknown splits are ignored (a
    /// late report after the split went to someone else).
    fn deliver(&mut self, task: u64, done: &[u64]) {
        for s in done {
            if self.leased.get(s) == Some(&task) {
                self.leased.remove(s);
                self.delivered += 1;
            }
        }
    }

    /// The task's worker died: its leases go back.
    pub(super) fn revoke(&mut self, task: u64) {
        let lost: Vec<u64> = self
            .leased
            .iter()
            .filter(|(_, t)| **t == task)
            .map(|(s, _)| *s)
            .collect();
        for s in lost {
            self.leased.remove(&s);
            self.reissue.insert(s);
        }
    }
}

impl DispatcherState {
    pub(super) fn get_split(
        &mut self,
        task_id: u64,
        done: &[u64],
        max: u32,
    ) -> Result<DispatchOutput, OpError> {
        let Some(task) = self.tasks.get(&task_id) else {
            return Err(not_found("task", task_id));
        };
        if task.removed {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "task {task_id} was removed (its worker {} was declared dead or its job was collected); its splits go to other workers",
                    task.worker
                ),
            ));
        }
        let job_id = task.job;
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Err(not_found("job", job_id));
        };
        if job.mode != Mode::Dynamic {
            return Err(status(
                Code::FailedPrecondition,
                format!("task {task_id} belongs to job {job_id}, whose processing mode is {:?}, not DYNAMIC: it has no splits to hand out", job.mode),
            ));
        }
        job.splits.deliver(task_id, done);
        let answer = if job.finished {
            SplitAnswer::EndOfSplits
        } else {
            job.splits.take(task_id, max)
        };
        if answer == SplitAnswer::EndOfSplits {
            self.check_job_finished(job_id);
        }
        Ok(DispatchOutput::Split(answer))
    }

    /// A worker reports delivered splits and finished tasks.
    pub(super) fn worker_update(
        &mut self,
        address: &str,
        done: &[(u64, u64)],
        completed: &[u64],
    ) -> Result<DispatchOutput, OpError> {
        if !self.workers.contains_key(address) {
            return Err(status(
                Code::NotFound,
                format!("worker {address} is not registered with the dispatcher"),
            ));
        }
        for task in done.iter().map(|(t, _)| t).chain(completed) {
            match self.tasks.get(task) {
                None => return Err(not_found("task", *task)),
                Some(t) if t.worker != address => {
                    return Err(status(
                        Code::InvalidArgument,
                        format!("task {task} runs on worker {}, not on {address}", t.worker),
                    ))
                }
                Some(_) => {}
            }
        }
        let mut jobs = BTreeSet::new();
        for (task, split) in done {
            let job = self.tasks[task].job;
            if let Some(j) = self.jobs.get_mut(&job) {
                j.splits.deliver(*task, &[*split]);
            }
            jobs.insert(job);
        }
        for task in completed {
            if let Some(t) = self.tasks.get_mut(task) {
                t.finished = true;
                jobs.insert(t.job);
            }
        }
        for job in jobs {
            self.check_job_finished(job);
        }
        Ok(DispatchOutput::Done)
    }
}

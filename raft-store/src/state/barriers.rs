//! Barrier records: who must arrive, who has, by when, and how it ended.
//!
//! A barrier id can be used again: each use is an *instance* with a counter (0, 1, ...), as in
//! newer TensorFlow and XLA. The first arrival of an instance fixes its participants and its
//! deadline (that arrival's proposal time + its timeout, stored as an absolute time, so any replica
//! that becomes leader re-arms the same timer). Once an instance has passed or failed, calls for it
//! get the stored outcome.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::cluster::{list_tasks, ClusterConfig, TaskName};
use super::derived::Derived;
use super::task_set::TaskSet;
use crate::error::Code;

/// Outcomes of this many finished instances are kept per id, for late callers.
const KEPT_OUTCOMES: usize = 4;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Participants {
    /// Every task of the cluster.
    All,
    Only(BTreeSet<TaskName>),
    /// The tasks of a set named as runs (XLA's register barrier of one job of several). Appended
    /// last: records are encoded by variant index.
    Set(TaskSet),
}

impl Participants {
    pub fn from_request(tasks: &[TaskName]) -> Self {
        if tasks.is_empty() {
            Participants::All
        } else {
            Participants::Only(tasks.iter().cloned().collect())
        }
    }

    /// `set`, a set of tasks of `config`: every task as `All`.
    pub fn from_set(set: &TaskSet, config: &ClusterConfig) -> Self {
        if set.len() == config.task_count() {
            Participants::All
        } else {
            Participants::Set(set.clone())
        }
    }

    pub fn contains(&self, t: &TaskName, config: &ClusterConfig) -> bool {
        match self {
            Participants::All => config.contains(t),
            Participants::Only(s) => s.contains(t),
            Participants::Set(s) => s.contains(t),
        }
    }

    pub fn count(&self, config: &ClusterConfig) -> usize {
        match self {
            Participants::All => config.task_count(),
            Participants::Only(s) => s.len(),
            Participants::Set(s) => s.len(),
        }
    }

    /// The same set of tasks, however it was written.
    pub fn same_as(&self, other: &Participants, config: &ClusterConfig) -> bool {
        match (self, other) {
            (Participants::All, Participants::All) => true,
            (Participants::Only(a), Participants::Only(b)) => a == b,
            (Participants::All, Participants::Only(s))
            | (Participants::Only(s), Participants::All) => {
                s.len() == config.task_count() && s.iter().all(|t| config.contains(t))
            }
            (Participants::Set(a), Participants::Set(b)) => a == b,
            (Participants::All, Participants::Set(s))
            | (Participants::Set(s), Participants::All) => {
                s.len() == config.task_count() && s.first_unknown(config).is_none()
            }
            (Participants::Only(o), Participants::Set(s))
            | (Participants::Set(s), Participants::Only(o)) => {
                o.len() == s.len() && o.iter().all(|t| s.contains(t))
            }
        }
    }

    pub fn iter<'a>(
        &'a self,
        config: &'a ClusterConfig,
    ) -> Box<dyn Iterator<Item = TaskName> + 'a> {
        match self {
            Participants::All => Box::new(config.all_tasks()),
            Participants::Only(s) => Box::new(s.iter().cloned()),
            Participants::Set(s) => Box::new(s.iter()),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed { code: Code, message: String },
}

/// One instance of a barrier.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct BarrierRecord {
    pub id: String,
    pub counter: i64,
    pub participants: Participants,
    pub arrived: BTreeSet<TaskName>,
    /// Absolute time (ms since the epoch, leader clock at the first arrival) after which the
    /// instance fails; `None` = no deadline.
    pub deadline_ms: Option<u64>,
    pub timeout_ms: u64,
    pub outcome: Option<Outcome>,
    /// Finished instances before this one: (counter, outcome), newest last.
    pub earlier: VecDeque<(i64, Outcome)>,
}

impl BarrierRecord {
    pub fn is_pending(&self) -> bool {
        self.outcome.is_none()
    }

    /// Participants that have not arrived.
    pub fn missing<'a>(&'a self, config: &'a ClusterConfig) -> impl Iterator<Item = TaskName> + 'a {
        self.participants
            .iter(config)
            .filter(move |t| !self.arrived.contains(t))
    }

    pub fn outcome_of(&self, counter: i64) -> Option<&Outcome> {
        if counter == self.counter {
            return self.outcome.as_ref();
        }
        self.earlier
            .iter()
            .find(|(c, _)| *c == counter)
            .map(|(_, o)| o)
    }

    /// Instance `counter` of `id`, ended with `outcome` before anyone arrived (failed or
    /// cancelled ahead of its callers, who will get that outcome).
    fn ended_before_start(id: &str, counter: i64, outcome: Outcome) -> Self {
        BarrierRecord {
            id: id.to_string(),
            counter,
            participants: Participants::All,
            arrived: BTreeSet::new(),
            deadline_ms: None,
            timeout_ms: 0,
            outcome: Some(outcome),
            earlier: VecDeque::new(),
        }
    }

    fn start_next(
        &mut self,
        counter: i64,
        participants: Participants,
        deadline_ms: Option<u64>,
        timeout_ms: u64,
    ) {
        if let Some(done) = self.outcome.take() {
            self.earlier.push_back((self.counter, done));
            while self.earlier.len() > KEPT_OUTCOMES {
                self.earlier.pop_front();
            }
        }
        self.counter = counter;
        self.participants = participants;
        self.arrived.clear();
        self.deadline_ms = deadline_ms;
        self.timeout_ms = timeout_ms;
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Barriers {
    by_id: BTreeMap<String, BarrierRecord>,
    /// The ids whose current instance is pending, in id order; found at first use (a decoded
    /// state finds them once), then kept by each change. A job keeps every barrier id it ever
    /// used (one per checkpoint step, say) but few are pending at once, and every task that
    /// leaves or fails looks for the pending ones it takes part in: a walk of every id would
    /// cost a task's change the job's history.
    #[serde(skip)]
    pending_ids: Derived<OnceLock<BTreeSet<String>>>,
}

type Records = BTreeMap<String, BarrierRecord>;

/// What an arrival made of its barrier instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The instance is (now) finished with this outcome.
    Done { counter: i64, outcome: Outcome },
    /// The caller is recorded; the instance waits for others.
    Waiting { counter: i64 },
    /// The request itself is wrong and the instance was not touched.
    Rejected { code: Code, message: String },
}

impl Barriers {
    pub fn get(&self, id: &str) -> Option<&BarrierRecord> {
        self.by_id.get(id)
    }

    /// The pending instances, in id order.
    pub fn pending(&self) -> impl Iterator<Item = &BarrierRecord> {
        let ids = self.pending_ids.0.get_or_init(|| {
            self.by_id
                .values()
                .filter(|b| b.is_pending())
                .map(|b| b.id.clone())
                .collect()
        });
        ids.iter().filter_map(|id| self.by_id.get(id))
    }

    /// Runs `change` on the records, of which it may change only `id`'s, and keeps the pending
    /// ids (if found yet) up to date with that record.
    fn changing<R>(&mut self, id: &str, change: impl FnOnce(&mut Records) -> R) -> R {
        let out = change(&mut self.by_id);
        if let Some(ids) = self.pending_ids.0.get_mut() {
            let pending = self.by_id.get(id).is_some_and(BarrierRecord::is_pending);
            if !pending {
                ids.remove(id);
            } else if !ids.contains(id) {
                ids.insert(id.to_string());
            }
        }
        out
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Records `source` arriving at instance `counter` of barrier `id`. The caller has checked that
    /// `source` and every listed task are in the cluster.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn arrive(
        &mut self,
        id: &str,
        counter: i64,
        participants: Participants,
        timeout_ms: u64,
        source: &TaskName,
        now_ms: u64,
        config: &ClusterConfig,
    ) -> Arrival {
        self.changing(id, |by_id| {
            let deadline = (timeout_ms > 0).then(|| now_ms.saturating_add(timeout_ms));
            let rec = match by_id.get_mut(id) {
                None => by_id.entry(id.to_string()).or_insert(BarrierRecord {
                    id: id.to_string(),
                    counter,
                    participants,
                    arrived: BTreeSet::new(),
                    deadline_ms: deadline,
                    timeout_ms,
                    outcome: None,
                    earlier: VecDeque::new(),
                }),
                Some(rec) => {
                    if counter == rec.counter {
                        if let Some(outcome) = &rec.outcome {
                            return Arrival::Done {
                                counter,
                                outcome: outcome.clone(),
                            };
                        }
                        if !rec.participants.same_as(&participants, config) {
                            let outcome = Outcome::Failed {
                                code: Code::InvalidArgument,
                                message: format!(
                                    "barrier {id:?}: task {source} names other participants than the first caller did"
                                ),
                            };
                            rec.outcome = Some(outcome.clone());
                            return Arrival::Done { counter, outcome };
                        }
                        rec
                    } else if counter == rec.counter + 1 && !rec.is_pending() {
                        rec.start_next(counter, participants, deadline, timeout_ms);
                        rec
                    } else if let Some(outcome) = rec.outcome_of(counter) {
                        return Arrival::Done {
                            counter,
                            outcome: outcome.clone(),
                        };
                    } else {
                        return Arrival::Rejected {
                            code: Code::InvalidArgument,
                            message: format!(
                                "barrier {id:?}: counter {counter} does not follow instance {} ({})",
                                rec.counter,
                                if rec.is_pending() {
                                    "still pending"
                                } else {
                                    "finished"
                                }
                            ),
                        };
                    }
                }
            };
            if !rec.participants.contains(source, config) {
                let outcome = Outcome::Failed {
                    code: Code::InvalidArgument,
                    message: format!("barrier {id:?}: task {source} is not one of its participants"),
                };
                rec.outcome = Some(outcome.clone());
                return Arrival::Done { counter, outcome };
            }
            rec.arrived.insert(source.clone());
            if rec.arrived.len() == rec.participants.count(config) {
                rec.outcome = Some(Outcome::Passed);
                return Arrival::Done {
                    counter,
                    outcome: Outcome::Passed,
                };
            }
            Arrival::Waiting { counter }
        })
    }

    /// Fails instance `counter` of `id`, creating it already failed if it has not started. Returns
    /// the instance's outcome and whether this call failed it.
    pub(crate) fn fail_or_create(
        &mut self,
        id: &str,
        counter: i64,
        code: Code,
        message: String,
    ) -> Result<(Outcome, bool), (Code, String)> {
        self.changing(id, |by_id| {
            let failed = Outcome::Failed { code, message };
            match by_id.get_mut(id) {
                None => {
                    by_id.insert(
                        id.to_string(),
                        BarrierRecord::ended_before_start(id, counter, failed.clone()),
                    );
                    Ok((failed, true))
                }
                Some(rec) if rec.counter == counter => match &rec.outcome {
                    Some(done) => Ok((done.clone(), false)),
                    None => {
                        rec.outcome = Some(failed.clone());
                        Ok((failed, true))
                    }
                },
                Some(rec) if counter == rec.counter + 1 && !rec.is_pending() => {
                    rec.start_next(counter, Participants::All, None, 0);
                    rec.outcome = Some(failed.clone());
                    Ok((failed, true))
                }
                Some(rec) => match rec.outcome_of(counter) {
                    Some(done) => Ok((done.clone(), false)),
                    None => Err((
                        Code::InvalidArgument,
                        format!(
                            "barrier {id:?}: counter {counter} does not follow instance {}",
                            rec.counter
                        ),
                    )),
                },
            }
        })
    }

    /// Fails a pending instance; returns whether it was pending.
    pub(crate) fn fail(&mut self, id: &str, counter: i64, code: Code, message: String) -> bool {
        self.changing(id, |by_id| match by_id.get_mut(id) {
            Some(rec) if rec.counter == counter && rec.is_pending() => {
                rec.outcome = Some(Outcome::Failed { code, message });
                true
            }
            _ => false,
        })
    }

    /// Cancels instance `counter` of `id`: a pending one fails CANCELLED, one not started yet is
    /// created cancelled (so its future callers get CANCELLED), a passed one cannot be cancelled.
    pub(crate) fn cancel(
        &mut self,
        id: &str,
        counter: i64,
        source: &TaskName,
    ) -> Result<bool, (Code, String)> {
        self.changing(id, |by_id| {
            let message = format!("barrier {id:?} was cancelled by task {source}");
            let cancelled = Outcome::Failed {
                code: Code::Cancelled,
                message: message.clone(),
            };
            match by_id.get_mut(id) {
                None => {
                    by_id.insert(
                        id.to_string(),
                        BarrierRecord::ended_before_start(id, counter, cancelled),
                    );
                    Ok(true)
                }
                Some(rec) if rec.counter == counter => match &rec.outcome {
                    None => {
                        rec.outcome = Some(cancelled);
                        Ok(true)
                    }
                    Some(Outcome::Passed) => Err((
                        Code::FailedPrecondition,
                        format!("barrier {id:?} has already passed; it cannot be cancelled"),
                    )),
                    Some(Outcome::Failed { .. }) => Ok(false),
                },
                Some(rec) if counter == rec.counter + 1 && !rec.is_pending() => {
                    rec.start_next(counter, Participants::All, None, 0);
                    rec.outcome = Some(cancelled);
                    Ok(true)
                }
                Some(rec) => match rec.outcome_of(counter) {
                    Some(Outcome::Passed) => Err((
                        Code::FailedPrecondition,
                        format!("barrier {id:?} instance {counter} has already passed; it cannot be cancelled"),
                    )),
                    Some(_) => Ok(false),
                    None => Err((
                        Code::InvalidArgument,
                        format!("barrier {id:?}: counter {counter} does not follow instance {}", rec.counter),
                    )),
                },
            }
        })
    }

    /// Fails instance `counter` of `id` with DEADLINE_EXCEEDED if it is pending and its deadline has
    /// come by `now_ms`; returns whether it did.
    pub(crate) fn expire(
        &mut self,
        id: &str,
        counter: i64,
        now_ms: u64,
        config: &ClusterConfig,
    ) -> bool {
        self.changing(id, |by_id| {
            let Some(rec) = by_id.get_mut(id) else {
                return false;
            };
            let due = rec.deadline_ms.is_some_and(|d| d <= now_ms);
            if rec.counter != counter || !rec.is_pending() || !due {
                return false;
            }
            let missing: Vec<TaskName> = rec.missing(config).collect();
            let message = format!(
                "barrier {id:?} timed out after {} ms with {} of {} tasks arrived; not arrived: {}",
                rec.timeout_ms,
                rec.arrived.len(),
                rec.participants.count(config),
                list_tasks(&missing, 10)
            );
            rec.outcome = Some(Outcome::Failed {
                code: Code::DeadlineExceeded,
                message,
            });
            true
        })
    }

    /// Whether the kept pending ids are what a walk of the records gives.
    #[cfg(test)]
    pub(crate) fn kept_pending_agrees(&self) -> bool {
        let walked: Vec<&str> = self
            .by_id
            .values()
            .filter(|b| b.is_pending())
            .map(|b| b.id.as_str())
            .collect();
        let kept: Vec<&str> = self.pending().map(|b| b.id.as_str()).collect();
        walked == kept
    }

    /// Pending instances that `task` takes part in: (id, counter).
    pub(crate) fn pending_with(
        &self,
        task: &TaskName,
        config: &ClusterConfig,
    ) -> Vec<(String, i64)> {
        self.pending()
            .filter(|b| b.participants.contains(task, config))
            .map(|b| (b.id.clone(), b.counter))
            .collect()
    }
}

#[cfg(test)]
#[path = "barriers_tests.rs"]
mod tests;

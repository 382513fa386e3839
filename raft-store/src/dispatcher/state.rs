//! [`DispatcherState`]: everything the dispatcher knows, and what its surfaces read of it. The
//! updates that change it are the children of `dispatcher`, each an `impl` block of its own;
//! `dispatcher::apply` routes an op to them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::errors::status;
use super::model::{Dataset, Iteration, Job, LegacyIds, NextIds, Task, Worker};
use crate::error::{Code, OpError};

/// Everything the dispatcher knows. A part of `CoordState`, so of every snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatcherState {
    pub datasets: BTreeMap<String, Dataset>,
    /// A definition's fingerprint -> its dataset.
    pub by_fingerprint: BTreeMap<u64, String>,
    pub workers: BTreeMap<String, Worker>,
    pub jobs: BTreeMap<i64, Job>,
    pub jobs_by_name: BTreeMap<String, i64>,
    pub iterations: BTreeMap<i64, Iteration>,
    /// (job name, repetition) -> the iteration (the latest, if one was garbage-collected).
    pub iterations_by_key: BTreeMap<(String, i64), i64>,
    /// Every task not removed by MaybeRemoveTask (TF forgets those).
    pub tasks: BTreeMap<i64, Task>,
    /// Iteration client -> its iteration.
    pub clients: BTreeMap<i64, i64>,
    pub next: NextIds,
    /// Ops applied so far (a refused op changes nothing and is not counted).
    pub updates: u64,
    /// DYNAMIC splits handed out for the first time, every iteration together.
    pub splits_handed_out: u64,
    /// Present when the state began as coord's dispatcher of before (see `dispatcher::legacy`).
    pub legacy: Option<LegacyIds>,
    /// While an update of coord's dispatcher of before is applied: its new ids number on from
    /// [`LegacyIds::last_id`], as that dispatcher's did. Never set between updates.
    #[serde(skip)]
    pub(super) replaying_legacy: bool,
}

impl DispatcherState {
    /// The tasks an iteration's clients read (TF's `TasksForIteration`): not removed.
    pub fn iteration_tasks<'a>(&'a self, it: &'a Iteration) -> impl Iterator<Item = &'a Task> {
        it.tasks
            .iter()
            .filter_map(|t| self.tasks.get(t))
            .filter(|t| !t.removed)
    }

    /// The iteration of an iteration client, with TF's error for an unknown one.
    pub fn client_iteration(&self, client: i64) -> Result<&Iteration, OpError> {
        self.clients
            .get(&client)
            .and_then(|i| self.iterations.get(i))
            .ok_or_else(|| {
                status(
                    Code::NotFound,
                    format!("Iteration client id not found: {client}"),
                )
            })
    }

    /// Iteration clients whose iteration has not finished (TF's `ListActiveClientIds`).
    pub fn active_clients(&self) -> impl Iterator<Item = i64> + '_ {
        self.clients
            .iter()
            .filter(|(_, it)| self.iterations.get(it).is_some_and(|it| !it.finished))
            .map(|(c, _)| *c)
    }

    /// The dataset an iteration reads.
    pub fn iteration_dataset(&self, it: &Iteration) -> Option<&Dataset> {
        let job = self.jobs.get(&it.job)?;
        self.datasets.get(&job.dataset)
    }

    /// Whether the iteration reads a coord definition (its workers report delivery).
    pub fn reads_definition(&self, it: &Iteration) -> bool {
        self.iteration_dataset(it)
            .is_some_and(|d| d.source.is_definition())
    }

    pub(crate) fn is_round_robin(&self, job: i64) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.num_consumers.is_some())
    }
}

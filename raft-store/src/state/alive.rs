//! GetAliveTasks as XLA defines it: a barrier over the *live* tasks of a set.
//!
//! Each task of the set asks; once every task of the set that is still connected has asked, all
//! askers get one answer: the connected tasks and their incarnations. A task that dies while the
//! others wait no longer holds them up (the answer is re-checked whenever a task's state
//! changes). Every completed round of a set gets a generation number, and the last few answers are
//! kept, so a call re-driven on a new leader finds the answer of the round it joined.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::cluster::TaskName;
use super::tasks::{TaskRegistry, TaskState};

/// Answers kept per set, for callers re-driven after a leader change.
const KEPT_ANSWERS: usize = 4;

/// The live tasks of a set and the incarnation each registered with, in task order.
pub type AliveAnswer = Vec<(TaskName, u64)>;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct Round {
    /// The round now collecting askers.
    generation: u64,
    asked: BTreeSet<TaskName>,
    /// Finished rounds: (generation, answer), newest last.
    answers: VecDeque<(u64, AliveAnswer)>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct AliveQueries {
    /// By the (sorted, deduplicated) set of tasks asked about.
    by_set: BTreeMap<Vec<TaskName>, Round>,
}

/// The name under which callers of `set` park (with the generation as counter): barrier waiters
/// are reused, so it must not collide with a caller's barrier id.
pub fn wait_key(set: &[TaskName]) -> String {
    let names: Vec<String> = set.iter().map(|t| t.to_string()).collect();
    format!("coord-internal:alive:{}", names.join(","))
}

/// `tasks` as the key of its set.
pub fn set_key(tasks: &[TaskName]) -> Vec<TaskName> {
    let s: BTreeSet<TaskName> = tasks.iter().cloned().collect();
    s.into_iter().collect()
}

impl AliveQueries {
    /// `source` asks about `set`; returns the round's generation and, if this arrival completed
    /// it, the answer.
    pub(crate) fn ask(
        &mut self,
        set: Vec<TaskName>,
        source: &TaskName,
        tasks: &TaskRegistry,
    ) -> (u64, Option<AliveAnswer>) {
        let round = self.by_set.entry(set.clone()).or_default();
        round.asked.insert(source.clone());
        let generation = round.generation;
        let answer = Self::complete(&set, round, tasks);
        (generation, answer)
    }

    /// Re-checks every open round after a task changed state; returns the (set, generation) of
    /// each round that completed.
    pub(crate) fn recheck(&mut self, tasks: &TaskRegistry) -> Vec<(Vec<TaskName>, u64)> {
        let mut done = Vec::new();
        for (set, round) in self.by_set.iter_mut() {
            if round.asked.is_empty() {
                continue;
            }
            let generation = round.generation;
            if Self::complete(set, round, tasks).is_some() {
                done.push((set.clone(), generation));
            }
        }
        done
    }

    /// The answer of round `generation` of `set`, once it finished (and while it is kept).
    pub fn answer(&self, set: &[TaskName], generation: u64) -> Option<&AliveAnswer> {
        self.by_set
            .get(set)?
            .answers
            .iter()
            .find(|(g, _)| *g == generation)
            .map(|(_, a)| a)
    }

    /// The rounds still waiting for askers: (set, who asked).
    pub fn open(&self) -> impl Iterator<Item = (&Vec<TaskName>, &BTreeSet<TaskName>)> {
        self.by_set
            .iter()
            .filter(|(_, r)| !r.asked.is_empty())
            .map(|(s, r)| (s, &r.asked))
    }

    /// Finishes the round if every connected task of the set has asked.
    fn complete(set: &[TaskName], round: &mut Round, tasks: &TaskRegistry) -> Option<AliveAnswer> {
        let alive: AliveAnswer = set
            .iter()
            .filter_map(|t| {
                let rec = tasks.get(t)?;
                (rec.state == TaskState::Connected).then(|| (t.clone(), rec.incarnation))
            })
            .collect();
        if !alive.iter().all(|(t, _)| round.asked.contains(t)) {
            return None;
        }
        round.answers.push_back((round.generation, alive.clone()));
        while round.answers.len() > KEPT_ANSWERS {
            round.answers.pop_front();
        }
        round.generation += 1;
        round.asked.clear();
        Some(alive)
    }
}

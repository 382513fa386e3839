//! GetAliveTasks as XLA defines it: a barrier over the *live* tasks of a set.
//!
//! Each task of the set asks; once every task of the set that is still connected has asked, all
//! askers get one answer: the connected tasks and their incarnations. A task that dies while the
//! others wait no longer holds them up (the answer is re-checked whenever a task's state
//! changes). Every completed round of a set gets a generation number, and the last few answers are
//! kept, so a call re-driven on a new leader finds the answer of the round it joined.
//!
//! jaxlib asks about every task of the job, so a round's set is N tasks and N tasks ask: each ask
//! costs the time of the set's runs (a [`TaskSet`]) and a count, not a walk of the set; so does a
//! task's change of state (the count moves by it). The set is walked when the round opens and
//! when it completes. The answer is
//! shared by every asker (one `Arc`), not copied for each.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::cluster::TaskName;
use super::derived::Derived;
use super::task_set::TaskSet;
use super::tasks::{Moved, TaskRegistry, TaskState};

/// Answers kept per set, for callers re-driven after a leader change.
const KEPT_ANSWERS: usize = 4;

/// The live tasks of a set and the incarnation each registered with, in task order; one answer
/// for every asker of a round.
pub type AliveAnswer = Arc<Vec<(TaskName, u64)>>;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct Round {
    /// The round now collecting askers.
    generation: u64,
    asked: BTreeSet<TaskName>,
    /// Finished rounds: (generation, answer), newest last.
    answers: VecDeque<(u64, AliveAnswer)>,
    /// Connected tasks of the set that have not asked (known once counted).
    #[serde(skip)]
    waiting_for: Derived<Option<usize>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct AliveQueries {
    /// By the set of tasks asked about, encoded as each set's list of tasks (as every format
    /// before sets were runs encoded it).
    #[serde(serialize_with = "sets_as_lists", deserialize_with = "sets_from_lists")]
    by_set: BTreeMap<TaskSet, Round>,
}

fn sets_as_lists<S: Serializer>(
    by_set: &BTreeMap<TaskSet, Round>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(
        by_set
            .iter()
            .map(|(set, r)| (set.iter().collect::<Vec<_>>(), r)),
    )
}

fn sets_from_lists<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<TaskSet, Round>, D::Error> {
    let lists = BTreeMap::<Vec<TaskName>, Round>::deserialize(d)?;
    Ok(lists
        .into_iter()
        .map(|(list, r)| (TaskSet::of_tasks(&list), r))
        .collect())
}

/// The name under which callers of `set` park (with the generation as counter): barrier waiters
/// are reused, so it must not collide with a caller's barrier id.
pub fn wait_key(set: &TaskSet) -> String {
    format!("coord-internal:alive:{set}")
}

impl AliveQueries {
    /// `source` asks about `set`; returns the round's generation and, if this arrival completed
    /// it, the answer.
    pub(crate) fn ask(
        &mut self,
        set: &TaskSet,
        source: &TaskName,
        tasks: &TaskRegistry,
    ) -> (u64, Option<AliveAnswer>) {
        let round = self.by_set.entry(set.clone()).or_default();
        let newly = round.asked.insert(source.clone());
        let generation = round.generation;
        match &mut round.waiting_for.0 {
            Some(n) if newly && is_connected(tasks, source) => *n = n.saturating_sub(1),
            Some(_) => {}
            None => round.waiting_for.0 = Some(Self::count_waiting(set, round, tasks)),
        }
        let answer = Self::complete(set, round, tasks);
        (generation, answer)
    }

    /// Re-checks every open round after the tasks `moved` changed state; returns the (set,
    /// generation) of each round that completed. Each move costs a look at each open round, not
    /// a walk of its set: a job whose tasks leave one by one while the others wait must not
    /// cost a walk of the job per leaver.
    pub(crate) fn recheck(&mut self, tasks: &TaskRegistry, moved: &[Moved]) -> Vec<(TaskSet, u64)> {
        let mut done = Vec::new();
        for (set, round) in self.by_set.iter_mut() {
            if round.asked.is_empty() {
                continue;
            }
            let generation = round.generation;
            round.waiting_for.0 = Some(match round.waiting_for.0 {
                Some(n) => moved
                    .iter()
                    .filter(|m| set.contains(&m.task) && !round.asked.contains(&m.task))
                    .fold(n, |n, m| {
                        let (was, is) =
                            (m.from == TaskState::Connected, m.to == TaskState::Connected);
                        (n + usize::from(is)).saturating_sub(usize::from(was))
                    }),
                None => Self::count_waiting(set, round, tasks),
            });
            if Self::complete(set, round, tasks).is_some() {
                done.push((set.clone(), generation));
            }
        }
        done
    }

    /// The answer of round `generation` of `set`, once it finished (and while it is kept).
    pub fn answer(&self, set: &TaskSet, generation: u64) -> Option<&AliveAnswer> {
        self.by_set
            .get(set)?
            .answers
            .iter()
            .find(|(g, _)| *g == generation)
            .map(|(_, a)| a)
    }

    /// The round of `set` now collecting askers (0 for a set never asked about): rounds before it
    /// have finished.
    pub fn generation(&self, set: &TaskSet) -> u64 {
        self.by_set.get(set).map_or(0, |r| r.generation)
    }

    /// The rounds still waiting for askers: (set, who asked).
    pub fn open(&self) -> impl Iterator<Item = (&TaskSet, &BTreeSet<TaskName>)> {
        self.by_set
            .iter()
            .filter(|(_, r)| !r.asked.is_empty())
            .map(|(s, r)| (s, &r.asked))
    }

    /// Whether every open round's kept count is what a walk of its set gives.
    #[cfg(test)]
    pub(crate) fn kept_counts_agree(&self, tasks: &TaskRegistry) -> bool {
        self.by_set.iter().all(|(set, round)| {
            round
                .waiting_for
                .0
                .is_none_or(|n| n == Self::count_waiting(set, round, tasks))
        })
    }

    /// Connected tasks of `set` that have not asked in `round`: a walk of the set.
    fn count_waiting(set: &TaskSet, round: &Round, tasks: &TaskRegistry) -> usize {
        #[cfg(test)]
        WALKS.with(|w| w.set(w.get() + 1));
        set.iter()
            .filter(|t| is_connected(tasks, t) && !round.asked.contains(t))
            .count()
    }

    /// Finishes the round if every connected task of the set has asked.
    fn complete(set: &TaskSet, round: &mut Round, tasks: &TaskRegistry) -> Option<AliveAnswer> {
        if round.waiting_for.0 != Some(0) {
            return None;
        }
        // The count was kept by moves; the set is walked to build the answer anyway, and a
        // round must never finish while a connected task of it has not asked.
        let waiting = Self::count_waiting(set, round, tasks);
        debug_assert_eq!(waiting, 0, "a round's kept count went wrong");
        if waiting != 0 {
            round.waiting_for.0 = Some(waiting);
            return None;
        }
        let alive: AliveAnswer = Arc::new(
            set.iter()
                .filter_map(|t| {
                    let rec = tasks.get(&t)?;
                    (rec.state == TaskState::Connected).then_some((t, rec.incarnation))
                })
                .collect(),
        );
        round.answers.push_back((round.generation, alive.clone()));
        while round.answers.len() > KEPT_ANSWERS {
            round.answers.pop_front();
        }
        round.generation += 1;
        round.asked.clear();
        round.waiting_for.0 = None;
        Some(alive)
    }
}

#[cfg(test)]
thread_local! {
    /// Walks of a set this thread made ([`AliveQueries::count_waiting`]), for tests of what a
    /// change costs.
    pub(crate) static WALKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

fn is_connected(tasks: &TaskRegistry, t: &TaskName) -> bool {
    tasks
        .get(t)
        .is_some_and(|r| r.state == TaskState::Connected)
}

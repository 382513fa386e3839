//! A set of tasks written as runs of consecutive task numbers: what XLA's calls about many tasks
//! (the register barrier of the whole job, GetAliveTasks of every task) commit instead of a list.
//!
//! jaxlib names the whole job in both calls, so a job of N tasks listing its tasks in each of its
//! N calls would be N² names in the log and N² work in apply (100,000 tasks: 220 GB of log for
//! one registration storm). As runs, the whole job is one run, and a set is compared, looked up
//! and checked against the cluster in the time of its runs, not of its tasks.

use serde::{Deserialize, Serialize};

use super::cluster::{ClusterConfig, TaskName};

/// Tasks `first..end` of `job` (`end` past any task number, so task `u32::MAX` has a run).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Run {
    job: String,
    first: u32,
    end: u64,
}

impl Run {
    /// The run's last task (a run is never empty).
    fn last(&self) -> u32 {
        u32::try_from(self.end - 1).unwrap_or(u32::MAX)
    }
}

/// A set of tasks: sorted, disjoint, non-adjacent runs, so that equal sets are equal values.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskSet {
    runs: Vec<Run>,
}

impl TaskSet {
    /// Every task of `job`, which has `n` tasks.
    pub fn whole_job(job: &str, n: u32) -> Self {
        let runs = (n > 0)
            .then(|| Run {
                job: job.to_string(),
                first: 0,
                end: u64::from(n),
            })
            .into_iter()
            .collect();
        Self { runs }
    }

    /// Tasks `ids` of `job`, in any order, repeats counted once.
    pub fn of_job(job: &str, ids: impl IntoIterator<Item = u32>) -> Self {
        let mut ids: Vec<u32> = ids.into_iter().collect();
        // jaxlib lists tasks in order: then this is one pass.
        if !ids.is_sorted() {
            ids.sort_unstable();
        }
        let mut runs: Vec<Run> = Vec::new();
        for id in ids {
            match runs.last_mut() {
                Some(r) if u64::from(id) < r.end => {}
                Some(r) if u64::from(id) == r.end => r.end += 1,
                _ => runs.push(Run {
                    job: job.to_string(),
                    first: id,
                    end: u64::from(id) + 1,
                }),
            }
        }
        Self { runs }
    }

    /// The set of `tasks`, in any order, repeats counted once.
    pub fn of_tasks<'a>(tasks: impl IntoIterator<Item = &'a TaskName>) -> Self {
        let mut by_job: std::collections::BTreeMap<&str, Vec<u32>> = Default::default();
        for t in tasks {
            by_job.entry(&t.job).or_default().push(t.task);
        }
        let runs = by_job
            .into_iter()
            .flat_map(|(job, ids)| Self::of_job(job, ids).runs)
            .collect();
        Self { runs }
    }

    pub fn len(&self) -> usize {
        self.runs
            .iter()
            .map(|r| (r.end - u64::from(r.first)) as usize)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    pub fn contains(&self, t: &TaskName) -> bool {
        // Runs sort by job, then first task: the last run that starts at or before `t`.
        let at = self
            .runs
            .partition_point(|r| (r.job.as_str(), r.first) <= (t.job.as_str(), t.task));
        at > 0 && {
            let r = &self.runs[at - 1];
            r.job == t.job && u64::from(t.task) < r.end
        }
    }

    /// Every task, in job then task order.
    pub fn iter(&self) -> impl Iterator<Item = TaskName> + '_ {
        self.runs
            .iter()
            .flat_map(|r| (r.first..=r.last()).map(move |task| TaskName::new(r.job.clone(), task)))
    }

    /// The first task of the set that is not a task of `config`.
    pub fn first_unknown(&self, config: &ClusterConfig) -> Option<TaskName> {
        self.runs
            .iter()
            .find_map(|r| match config.jobs.get(&r.job) {
                None => Some(TaskName::new(r.job.clone(), r.first)),
                Some(&n) if r.end > u64::from(n) => {
                    Some(TaskName::new(r.job.clone(), r.first.max(n)))
                }
                Some(_) => None,
            })
    }
}

/// The tasks of a register barrier, as an op names them: listed or as runs.
pub(crate) enum Participating<'a> {
    /// Listed one by one (the entries of builds before sets were runs).
    Listed(&'a [TaskName]),
    Runs(&'a TaskSet),
}

impl Participating<'_> {
    /// The first task named that is not a task of `config`.
    pub fn first_unknown(&self, config: &ClusterConfig) -> Option<TaskName> {
        match self {
            Participating::Listed(list) => list.iter().find(|t| !config.contains(t)).cloned(),
            Participating::Runs(set) => set.first_unknown(config),
        }
    }

    pub fn contains(&self, t: &TaskName) -> bool {
        match self {
            Participating::Listed(list) => list.contains(t),
            Participating::Runs(set) => set.contains(t),
        }
    }
}

impl std::fmt::Display for TaskSet {
    /// `job:0-99999,job:100001`: a name as short as the set's runs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, r) in self.runs.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if r.last() == r.first {
                write!(f, "{}:{}", r.job, r.first)?;
            } else {
                write!(f, "{}:{}-{}", r.job, r.first, r.last())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(i: u32) -> TaskName {
        TaskName::new("worker", i)
    }

    #[test]
    fn equal_sets_are_equal_however_listed() {
        let a = TaskSet::of_job("worker", [3, 0, 1, 2, 1, 7]);
        let b = TaskSet::of_tasks(&[w(7), w(2), w(1), w(0), w(3)]);
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "worker:0-3,worker:7");
        assert_eq!(a.len(), 5);
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            vec![w(0), w(1), w(2), w(3), w(7)]
        );
        assert_eq!(
            TaskSet::whole_job("worker", 4),
            TaskSet::of_job("worker", 0..4)
        );
        assert!(TaskSet::whole_job("worker", 0).is_empty());
    }

    #[test]
    fn membership_looks_at_job_and_run() {
        let mut tasks = vec![w(0), w(1), w(5), TaskName::new("ps", 2)];
        tasks.push(TaskName::new("ps", 3));
        let s = TaskSet::of_tasks(&tasks);
        for t in &tasks {
            assert!(s.contains(t), "{t}");
        }
        for t in [
            w(2),
            w(4),
            w(6),
            TaskName::new("ps", 1),
            TaskName::new("x", 0),
        ] {
            assert!(!s.contains(&t), "{t}");
        }
    }

    #[test]
    fn the_first_task_outside_the_cluster_is_named() {
        let config = ClusterConfig {
            jobs: [("worker".to_string(), 4)].into_iter().collect(),
            ..ClusterConfig::default()
        };
        assert_eq!(TaskSet::whole_job("worker", 4).first_unknown(&config), None);
        assert_eq!(
            TaskSet::of_job("worker", [1, 2, 3, 4, 5]).first_unknown(&config),
            Some(w(4))
        );
        assert_eq!(
            TaskSet::of_job("worker", [9]).first_unknown(&config),
            Some(w(9))
        );
        assert_eq!(
            TaskSet::of_job("ps", [0]).first_unknown(&config),
            Some(TaskName::new("ps", 0))
        );
    }

    #[test]
    fn a_whole_job_of_100000_tasks_is_a_few_bytes() {
        let set = TaskSet::whole_job("jax_worker", 100_000);
        assert!(crate::codec::encoded_len(&set) < 32);
        assert_eq!(set.len(), 100_000);
    }
}

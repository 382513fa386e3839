//! The coordinated job: which tasks exist, and the timeouts they live by.
//!
//! The configuration is part of the replicated state (the first leader proposes it from its
//! flags), so every replica judges tasks and barriers by the same configuration, whatever flags it
//! was started with.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// A task of the coordinated job: TensorFlow's `CoordinatedTask`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskName {
    pub job: String,
    pub task: u32,
}

impl TaskName {
    pub fn new(job: impl Into<String>, task: u32) -> Self {
        Self {
            job: job.into(),
            task,
        }
    }
}

impl fmt::Display for TaskName {
    /// TensorFlow's spelling, so messages read like the ones TF users know.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/job:{}/replica:0/task:{}", self.job, self.task)
    }
}

/// Joins task names for a message, at most `max` of them.
pub fn list_tasks<'a>(tasks: impl IntoIterator<Item = &'a TaskName>, max: usize) -> String {
    let mut out = Vec::new();
    let mut more = 0;
    for t in tasks {
        if out.len() < max {
            out.push(t.to_string());
        } else {
            more += 1;
        }
    }
    let mut s = out.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct ClusterConfig {
    /// Job name → number of tasks (task ids are `0..n`).
    pub jobs: BTreeMap<String, u32>,
    /// A connected task silent for this long is put in ERROR.
    pub heartbeat_timeout_ms: u64,
    /// WaitForAllTasks fails if not every task arrived this long after the first did (0 = never).
    pub register_timeout_ms: u64,
    /// If non-zero, ShutdownTask waits (this long at most) until every task is shutting down, so
    /// they disconnect together.
    pub shutdown_barrier_timeout_ms: u64,
    /// Tasks of these jobs may restart (register with a new incarnation) without failing the
    /// job, and their errors are not propagated.
    pub recoverable_jobs: BTreeSet<String>,
}

impl ClusterConfig {
    pub fn contains(&self, t: &TaskName) -> bool {
        self.jobs.get(&t.job).is_some_and(|&n| t.task < n)
    }

    /// Every task of the job, in job then task order.
    pub fn all_tasks(&self) -> impl Iterator<Item = TaskName> + '_ {
        self.jobs
            .iter()
            .flat_map(|(job, &n)| (0..n).map(move |task| TaskName::new(job.clone(), task)))
    }

    pub fn task_count(&self) -> usize {
        self.jobs.values().map(|&n| n as usize).sum()
    }

    pub fn is_recoverable(&self, t: &TaskName) -> bool {
        self.recoverable_jobs.contains(&t.job)
    }

    /// Why `t` is not a task of this job, for an INVALID_ARGUMENT message.
    pub fn why_unknown(&self, t: &TaskName) -> String {
        match self.jobs.get(&t.job) {
            None => format!(
                "task {t}: job {:?} is not in the cluster (jobs: {})",
                t.job,
                self.jobs.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            Some(n) => format!(
                "task {t}: job {:?} has tasks 0..{}",
                t.job,
                n.saturating_sub(1)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_and_messages() {
        let c = ClusterConfig {
            jobs: BTreeMap::from([("ps".to_string(), 1), ("worker".to_string(), 2)]),
            ..ClusterConfig::default()
        };
        assert!(c.contains(&TaskName::new("worker", 1)));
        assert!(!c.contains(&TaskName::new("worker", 2)));
        assert!(!c.contains(&TaskName::new("chief", 0)));
        let all: Vec<String> = c.all_tasks().map(|t| t.to_string()).collect();
        assert_eq!(
            all,
            [
                "/job:ps/replica:0/task:0",
                "/job:worker/replica:0/task:0",
                "/job:worker/replica:0/task:1"
            ]
        );
        assert!(c
            .why_unknown(&TaskName::new("chief", 0))
            .contains("\"chief\" is not in the cluster"));
        assert!(c
            .why_unknown(&TaskName::new("worker", 5))
            .contains("tasks 0..1"));
        let tasks: Vec<TaskName> = c.all_tasks().collect();
        assert_eq!(
            list_tasks(&tasks, 2),
            "/job:ps/replica:0/task:0, /job:worker/replica:0/task:0 and 1 more"
        );
    }
}

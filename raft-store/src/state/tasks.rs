//! The task registry and the error feed.
//!
//! Every configured task has a record: its state (DISCONNECTED, CONNECTED, ERROR), the
//! incarnation it registered with, the error that put it in ERROR, and the device info it sent with
//! WaitForAllTasks. Errors that other tasks must learn of go into the [`ErrorFeed`], numbered in
//! commit order; agents long-poll it by sequence number, so a poll re-driven on a new leader
//! neither misses nor repeats an error.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::OnceLock;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::cluster::{ClusterConfig, TaskName};
use super::derived::Derived;
use crate::error::Code;

/// The feed keeps this many errors; a poller that fell further behind gets the oldest kept one.
const FEED_CAPACITY: usize = 1024;

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    Disconnected,
    Connected,
    Error,
}

impl TaskState {
    /// The state as coordctl, the status page and metrics print it: TensorFlow's name without
    /// its `TASKSTATE_` prefix.
    pub fn name(self) -> &'static str {
        match self {
            TaskState::Disconnected => "DISCONNECTED",
            TaskState::Connected => "CONNECTED",
            TaskState::Error => "ERROR",
        }
    }
}

/// Why a task is in ERROR.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TaskError {
    pub code: Code,
    pub message: String,
    /// The task the error happened in.
    pub source: TaskName,
    /// Reported by the task itself (ReportErrorToService), not detected by the service.
    pub reported: bool,
}

/// A task's devices as it sent them: TensorFlow `DeviceAttributes` or an XLA
/// `GlobalTopologyProto`, kept serialized.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum DeviceInfo {
    Tf(Vec<Bytes>),
    Xla(Bytes),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct TaskRecord {
    pub state: TaskState,
    pub incarnation: u64,
    pub error: Option<TaskError>,
    pub devices: Option<DeviceInfo>,
    /// The error feed's last sequence number when the task last registered: XLA's PollForError
    /// delivers the errors after it.
    pub errors_seen_at_register: u64,
}

impl Default for TaskRecord {
    fn default() -> Self {
        Self {
            state: TaskState::Disconnected,
            incarnation: 0,
            error: None,
            devices: None,
            errors_seen_at_register: 0,
        }
    }
}

/// Every task's record, with how many are in each state kept beside them.
///
/// A 100,000-task job changes one task at a time (a registration, a shutdown, a missed
/// heartbeat), and what follows a change must not walk the job: whether any task is still
/// connected (runs), how many are (metrics, a namespace's TTL), and which open GetAliveTasks
/// rounds a change moves (alive). So the registry remembers the state of each record it hands out
/// for change ([`TaskRegistry::get_mut`]), and [`TaskRegistry::settle`], called once the command
/// is applied, turns those into the moves the command made and brings the counts up to date.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskRegistry {
    tasks: BTreeMap<TaskName, TaskRecord>,
    /// Tasks per state, counted at first use (a decoded registry counts once).
    #[serde(skip)]
    counts: Derived<OnceLock<[usize; 3]>>,
    /// The records handed out for change since the last [`TaskRegistry::settle`], with the state
    /// each was in; empty between commands.
    #[serde(skip)]
    touched: Derived<Vec<(TaskName, TaskState)>>,
}

/// A task whose state a command changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    pub task: TaskName,
    pub from: TaskState,
    pub to: TaskState,
}

fn slot(state: TaskState) -> usize {
    match state {
        TaskState::Disconnected => 0,
        TaskState::Connected => 1,
        TaskState::Error => 2,
    }
}

impl TaskRegistry {
    pub(crate) fn new(config: &ClusterConfig) -> Self {
        Self {
            tasks: config
                .all_tasks()
                .map(|t| (t, TaskRecord::default()))
                .collect(),
            ..Self::default()
        }
    }

    pub fn get(&self, t: &TaskName) -> Option<&TaskRecord> {
        self.tasks.get(t)
    }

    /// `t`'s record, to change; the command that changes it calls [`Self::settle`] after.
    pub(crate) fn get_mut(&mut self, t: &TaskName) -> Option<&mut TaskRecord> {
        let rec = self.tasks.get_mut(t)?;
        self.touched.0.push((t.clone(), rec.state));
        Some(rec)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&TaskName, &TaskRecord)> {
        self.tasks.iter()
    }

    /// The records of `job`'s tasks, in task order (a range of the records, not a walk of all).
    pub fn of_job(&self, job: &str) -> impl Iterator<Item = (&TaskName, &TaskRecord)> {
        self.tasks
            .range(TaskName::new(job, 0)..=TaskName::new(job, u32::MAX))
    }

    /// How many tasks are in `state`: O(1) once counted.
    pub fn count_in(&self, state: TaskState) -> usize {
        if !self.touched.0.is_empty() {
            // Within a command, records handed out are not settled yet: the kept counts are as
            // of the last settle, so the records are walked.
            return self.tasks.values().filter(|r| r.state == state).count();
        }
        self.counts.0.get_or_init(|| {
            let mut n = [0; 3];
            for r in self.tasks.values() {
                n[slot(r.state)] += 1;
            }
            n
        })[slot(state)]
    }

    /// The moves of the records handed out since the last call, each task once (from its state
    /// before the first hand-out to its state now), and the counts brought up to date.
    pub(crate) fn settle(&mut self) -> Vec<Moved> {
        let touched = std::mem::take(&mut self.touched.0);
        let moved: Vec<Moved> = first_touches(&touched)
            .filter_map(|(task, from)| {
                let to = self.tasks.get(task)?.state;
                (to != from).then(|| Moved {
                    task: task.clone(),
                    from,
                    to,
                })
            })
            .collect();
        if let Some(n) = self.counts.0.get_mut() {
            for m in &moved {
                n[slot(m.from)] = n[slot(m.from)].saturating_sub(1);
                n[slot(m.to)] += 1;
            }
        }
        moved
    }
}

/// Each task of `touched` once, with the state of its first hand-out.
fn first_touches(
    touched: &[(TaskName, TaskState)],
) -> impl Iterator<Item = (&TaskName, TaskState)> {
    let mut seen = BTreeSet::new();
    touched
        .iter()
        .filter(move |(t, _)| seen.insert(t))
        .map(|(t, from)| (t, *from))
}

/// One error other tasks must learn of.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ErrorEvent {
    pub seq: u64,
    pub error: TaskError,
    /// Only these tasks are told; `None` = every task but the source.
    pub only: Option<BTreeSet<TaskName>>,
}

impl ErrorEvent {
    pub fn concerns(&self, t: &TaskName) -> bool {
        match &self.only {
            Some(set) => set.contains(t),
            None => &self.error.source != t,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct ErrorFeed {
    /// Sequence number of the last event; events are numbered from 1.
    last_seq: u64,
    events: VecDeque<ErrorEvent>,
}

impl ErrorFeed {
    pub(crate) fn push(&mut self, error: TaskError, only: Option<BTreeSet<TaskName>>) -> u64 {
        self.last_seq += 1;
        self.events.push_back(ErrorEvent {
            seq: self.last_seq,
            error,
            only,
        });
        while self.events.len() > FEED_CAPACITY {
            self.events.pop_front();
        }
        self.last_seq
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The first event after `after` that concerns `task`.
    pub fn next_for(&self, task: &TaskName, after: u64) -> Option<&ErrorEvent> {
        self.events
            .iter()
            .find(|e| e.seq > after && e.concerns(task))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(source: u32) -> TaskError {
        TaskError {
            code: Code::Internal,
            message: "boom".into(),
            source: TaskName::new("w", source),
            reported: true,
        }
    }

    #[test]
    fn feed_delivers_in_order_to_everyone_but_the_source() {
        let mut f = ErrorFeed::default();
        let a = f.push(err(0), None);
        let b = f.push(err(1), Some([TaskName::new("w", 2)].into_iter().collect()));
        assert_eq!((a, b), (1, 2));
        let w0 = TaskName::new("w", 0);
        let w2 = TaskName::new("w", 2);
        assert_eq!(
            f.next_for(&w0, 0),
            None,
            "its own error, and one meant for w2 only"
        );
        assert_eq!(f.next_for(&w2, 0).map(|e| e.seq), Some(1));
        assert_eq!(f.next_for(&w2, 1).map(|e| e.seq), Some(2));
        assert_eq!(f.next_for(&w2, 2), None);
    }

    #[test]
    fn feed_is_bounded() {
        let mut f = ErrorFeed::default();
        for _ in 0..(FEED_CAPACITY + 10) {
            f.push(err(0), None);
        }
        assert_eq!(f.events.len(), FEED_CAPACITY);
        assert_eq!(
            f.next_for(&TaskName::new("w", 1), 0).map(|e| e.seq),
            Some(11)
        );
    }
}

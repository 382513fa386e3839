//! The task registry and the error feed.
//!
//! Every configured task has a record: its state (DISCONNECTED, CONNECTED, ERROR), the
//! incarnation it registered with, the error that put it in ERROR, and the device info it sent with
//! WaitForAllTasks. Errors that other tasks must learn of go into the [`ErrorFeed`], numbered in
//! commit order; agents long-poll it by sequence number, so a poll re-driven on a new leader
//! neither misses nor repeats an error.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::cluster::{ClusterConfig, TaskName};
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

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskRegistry {
    tasks: BTreeMap<TaskName, TaskRecord>,
}

impl TaskRegistry {
    pub(crate) fn new(config: &ClusterConfig) -> Self {
        Self {
            tasks: config
                .all_tasks()
                .map(|t| (t, TaskRecord::default()))
                .collect(),
        }
    }

    pub fn get(&self, t: &TaskName) -> Option<&TaskRecord> {
        self.tasks.get(t)
    }

    pub(crate) fn get_mut(&mut self, t: &TaskName) -> Option<&mut TaskRecord> {
        self.tasks.get_mut(t)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&TaskName, &TaskRecord)> {
        self.tasks.iter()
    }

    pub fn count_in(&self, state: TaskState) -> usize {
        self.tasks.values().filter(|r| r.state == state).count()
    }
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

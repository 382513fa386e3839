//! The memory quota on the replicated state (`--quota-bytes`, etcd's `--quota-backend-bytes`).
//!
//! The state lives in memory on every replica, so one client writing large values would grow all
//! three together until all are killed for memory at once. The quota bounds the state's bytes:
//! keys and values (counted exactly, with a per-entry overhead) plus the records outside the store
//! (tasks, barriers, the dispatcher, request sessions), measured as their encoded size.
//!
//! Everything here is decided in `apply`, from the state alone, so every replica agrees on which
//! write was refused: the bound itself is replicated (the leader proposes its flag with
//! [`Op::SetQuota`](crate::Op::SetQuota)), and the records are re-measured after every
//! [`MEASURE_EVERY`] commands that may grow them, or one command per [`BYTES_PER_COMMAND`] of
//! records if that is more, each such command counted by its own encoded size in between (an
//! over-estimate until the next measure). A measure walks every record, so spacing measures by
//! the records' size bounds what it costs each command: a 100,000-task job's barrier arrivals
//! re-measured its ~30 MB of records every 256 arrivals, on every replica's Raft thread.
//!
//! Past the quota a write that would grow the state fails `RESOURCE_EXHAUSTED` naming the quota
//! and raises the alarm; deletes, reads, overwrites that do not grow, and the coordination
//! service's own records (bounded by the job's size) still go through. The alarm clears when usage
//! falls below [`CLEAR_BELOW_PERCENT`] of the quota, so a writer at the edge does not flap it.

use serde::{Deserialize, Serialize};

use crate::error::{Code, OpError};

/// Bytes counted for a key beyond its key and value bytes: the map node's share and the entry's
/// revisions.
pub const KV_ENTRY_OVERHEAD: u64 = 64;
/// Commands that may grow the records between two measures of them, at least.
pub const MEASURE_EVERY: u32 = 256;
/// Bytes of records per command between two measures: a measure of N bytes of records comes
/// after N / this many commands (when that is more than [`MEASURE_EVERY`]).
pub const BYTES_PER_COMMAND: u64 = 1024;
/// The alarm clears when usage falls below this percentage of the quota.
pub const CLEAR_BELOW_PERCENT: u64 = 95;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// The bound in bytes; 0: none (a state no leader has set a quota on yet).
    pub bytes: u64,
    /// The records outside the key-value store, in bytes: measured, plus the encoded size of
    /// every command that may have grown them since.
    pub records_bytes: u64,
    /// Commands that may have grown the records since they were last measured.
    since_measured: u32,
    /// A write was refused for the quota and usage has not fallen back far enough since.
    pub alarm: bool,
}

impl Quota {
    /// A bound of `bytes` (0: none) on a state that holds nothing yet.
    pub(crate) fn with_bound(bytes: u64) -> Self {
        Self {
            bytes,
            ..Self::default()
        }
    }

    /// `Some(refusal)` if `growth` more bytes on top of `usage` would pass the quota. `what`
    /// names the write ("the put of key \"k\"").
    pub(crate) fn refusal(
        &self,
        usage: u64,
        growth: u64,
        what: impl FnOnce() -> String,
    ) -> Option<OpError> {
        self.past(usage, growth, |bound| {
            format!(
                "the replicated state holds {usage} bytes of its {bound}-byte quota (--quota-bytes): {} needs {growth} more and is refused; delete keys or raise the quota",
                what()
            )
        })
    }

    /// `Some(refusal)` if `growth` more bytes on top of `usage` would pass this bound as the
    /// byte limit of namespace `name`.
    pub(crate) fn namespace_refusal(
        &self,
        name: &str,
        usage: u64,
        growth: u64,
        what: impl FnOnce() -> String,
    ) -> Option<OpError> {
        self.past(usage, growth, |bound| {
            format!(
                "namespace {name:?} holds {usage} bytes, its limit is {bound} (max_bytes): {} needs {growth} more and is refused; delete keys or raise the limit",
                what()
            )
        })
    }

    /// RESOURCE_EXHAUSTED with `message(bound)` if `growth` more bytes on top of `usage` would
    /// pass the bound.
    fn past(
        &self,
        usage: u64,
        growth: u64,
        message: impl FnOnce(u64) -> String,
    ) -> Option<OpError> {
        (self.bytes != 0 && usage.saturating_add(growth) > self.bytes).then(|| OpError::Status {
            code: Code::ResourceExhausted,
            message: message(self.bytes),
        })
    }

    /// Counts a command that may have grown the records by `encoded` bytes; true when they are
    /// due to be measured.
    pub(crate) fn note_record_write(&mut self, encoded: u64) -> bool {
        self.records_bytes = self.records_bytes.saturating_add(encoded);
        self.since_measured = self.since_measured.saturating_add(1);
        u64::from(self.since_measured)
            >= u64::from(MEASURE_EVERY).max(self.records_bytes / BYTES_PER_COMMAND)
    }

    pub(crate) fn measured(&mut self, records_bytes: u64) {
        self.records_bytes = records_bytes;
        self.since_measured = 0;
    }

    /// Clears the alarm once `usage` fell far enough below the quota (or the quota was lifted).
    pub(crate) fn settle(&mut self, usage: u64) {
        if self.alarm
            && (self.bytes == 0
                || u128::from(usage) * 100
                    < u128::from(self.bytes) * u128::from(CLEAR_BELOW_PERCENT))
        {
            self.alarm = false;
        }
    }
}

#[cfg(test)]
#[path = "quota_tests.rs"]
mod tests;

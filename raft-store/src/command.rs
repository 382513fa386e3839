//! The commands that travel through the Raft log, and what applying them returns.
//!
//! A command holds everything `apply` needs: the leader chose the time and any ids before it
//! proposed, so every replica computes the same result from the same log.

use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The payload of one Raft entry: a batch of commands proposed together.
///
/// The leader coalesces concurrent client writes into one proposal; they are applied in order, each
/// with its own result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
pub struct Proposal {
    /// The leader's wall clock, in milliseconds since the Unix epoch, when it proposed. The only
    /// clock `apply` ever sees.
    pub proposed_at_ms: u64,
    pub commands: Vec<Command>,
}

impl Proposal {
    pub fn new(proposed_at_ms: u64, commands: Vec<Command>) -> Self {
        Self {
            proposed_at_ms,
            commands,
        }
    }
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "proposal@{}ms[", self.proposed_at_ms)?;
        for (i, c) in self.commands.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}", c.op)?;
        }
        f.write_str("]")
    }
}

/// One client mutation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// Identifies the request so that a retry (after a timeout or a leader change) is applied once.
    /// `None` only for commands the leader issues on its own behalf.
    pub request: Option<RequestId>,
    pub op: Op,
}

/// A client's request id.
///
/// A client numbers its mutations `seq = 1, 2, ...` and may have several in flight at once. With each
/// request it sends `acked_below`: every request with a smaller `seq` has been answered, so the
/// state machine may forget those results (Raft thesis §6.3, extended to concurrent requests).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId {
    pub client: u64,
    pub seq: u64,
    pub acked_below: u64,
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}#{}", self.client, self.seq)
    }
}

/// A state change. Keys are already normalized by the proposer (and normalized again by apply).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Insert `key`; if it exists, fail with `AlreadyExists` unless `overwrite`.
    KvPut {
        key: String,
        value: Bytes,
        overwrite: bool,
    },
    /// Delete `key` and every key under `key/`.
    KvDelete { key: String },
    /// Add `delta` to the decimal integer stored at `key` (missing keys count as 0) and store the
    /// result as decimal ASCII.
    KvIncrement { key: String, delta: i64 },
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::KvPut {
                key,
                value,
                overwrite,
            } => write!(
                f,
                "put({key:?}, {} bytes, overwrite={overwrite})",
                value.len()
            ),
            Op::KvDelete { key } => write!(f, "delete({key:?})"),
            Op::KvIncrement { key, delta } => write!(f, "increment({key:?}, {delta})"),
        }
    }
}

/// What applying one command produced. Failures here are deterministic outcomes of the command
/// (every replica reaches the same one), not storage errors.
pub type CommandResult = Result<Output, OpError>;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// The command took effect and returns nothing.
    Done,
    /// The value the command left at its key (the new total of an increment).
    Value(Bytes),
    /// How many keys a delete removed.
    Deleted(u64),
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    #[error("key must not be empty")]
    EmptyKey,
    #[error("value of key {key:?} is not a decimal integer, cannot increment it")]
    NotAnInteger { key: String },
    #[error("incrementing key {key:?} by {delta} overflows a 64-bit integer")]
    Overflow { key: String, delta: i64 },
    /// The request's result was already delivered and forgotten (its client has acknowledged it),
    /// so this copy is a late duplicate and is not applied again.
    #[error("request {request} is a duplicate of one already answered")]
    StaleDuplicate { request: RequestId },
}

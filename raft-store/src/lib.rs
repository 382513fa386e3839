//! coord-raft-store: the replicated state of a coord ensemble and the storage that makes it
//! durable. It knows nothing about gRPC; the server feeds it commands through openraft.
//!
//! - [`command`]: what a Raft entry carries ([`Proposal`] of [`Command`]s) and what applying
//!   returns.
//! - [`state`]: [`CoordState`] and its deterministic `apply` (a pure function, unit-tested with no
//!   runtime).
//! - [`dispatcher`]: the tf.data dispatcher's replicated state (the Raft log is its journal).
//! - [`key`]: TensorFlow's key normalization.
//! - [`storage`]: openraft's log storage (segment files with group-committed `fdatasync`), the in-memory
//!   state machine, snapshot files.
//! - [`codec`]: the binary encoding of entries, snapshots and Raft messages.
//! - [`stats`]: counters and histograms for metrics.
//! - [`types`]: the openraft type configuration.

// openraft's storage traits return its `StorageError` (over 200 bytes) by value; helpers share
// that type rather than box it and convert at every trait boundary.
#![allow(clippy::result_large_err)]

pub mod codec;
pub mod command;
pub mod dispatcher;
pub mod key;
pub mod state;
pub mod stats;
pub mod storage;
pub mod types;

pub use command::{Command, CommandResult, Op, OpError, Output, Proposal, RequestId};
pub use state::{Change, CoordState};
pub use types::{NodeId, TypeConfig};

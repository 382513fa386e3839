//! coord-raft-store: the replicated state of a coord ensemble and the storage that makes it
//! durable. It knows nothing about gRPC; the server feeds it commands through openraft.
//!
//! The modules, bottom up. Each uses only modules listed before it, so there is no import circle:
//!
//! - [`error`]: the shared vocabulary of outcomes: [`Code`](error::Code) (gRPC's codes),
//!   [`OpError`] (why a command was refused) and [`RequestId`]. A leaf: it imports nothing from
//!   the crate.
//! - [`key`]: TensorFlow's key normalization. A leaf.
//! - [`codec`]: the binary encoding of entries, snapshots and Raft messages. A leaf.
//! - [`stats`]: counters and histograms for metrics. A leaf.
//! - [`dispatcher`]: the tf.data dispatcher's replicated state (the Raft log is its journal),
//!   TensorFlow's model behind both dispatcher surfaces (TensorFlow's and coord's). Its apply
//!   returns its own [`DispatcherResult`](dispatcher::DispatcherResult); it uses only `error`.
//! - [`raw`]: the raw key space of the key-value store (keys taken as their bytes: torch's
//!   `TCPStore`), its ops and their apply; it uses only `error` and `codec`.
//! - [`state`]'s coordination records (`state::cluster`, `tasks`, `barriers`, `alive`): task
//!   names, the cluster configuration, task records, barrier instances, GetAliveTasks rounds. They
//!   use only `error` and know nothing of commands.
//! - [`command`]: what a Raft entry carries ([`Proposal`] of [`Command`]s) and what applying one
//!   returns ([`Output`], [`CommandResult`]), spelled with the records above and the dispatcher's
//!   ops.
//! - [`state`]: [`CoordState`] and its deterministic `apply` (a pure function, unit-tested with no
//!   runtime): the KV store, client sessions and the coordination transitions, which take commands
//!   and report [`Change`]s. The one place a dispatcher result becomes a [`CommandResult`].
//! - [`types`]: the openraft type configuration (a [`Proposal`] in, a [`CommandResult`] per command
//!   out).
//! - [`storage`]: openraft's log storage (segment files, or sled with `--raft-log sled`, either
//!   with group-committed `fdatasync`), the in-memory state machine, snapshot files.

// openraft's storage traits return its `StorageError` (over 200 bytes) by value; helpers share
// that type rather than box it and convert at every trait boundary.
#![allow(clippy::result_large_err)]

pub mod codec;
pub mod command;
pub mod dispatcher;
pub mod error;
pub mod key;
pub mod raw;
pub mod state;
pub mod stats;
pub mod storage;
pub mod types;

pub use command::{Command, CommandResult, Op, Output, Proposal};
pub use error::{OpError, RequestId};
pub use state::{Change, CoordState};
pub use types::{NodeId, TypeConfig};

//! The openraft type configuration of coord, and short names for the openraft types used with it.
//!
//! One Raft entry carries a [`Proposal`]: a batch of client commands that the leader coalesced, so
//! that many concurrent writes share one log entry, one replication round and one fsync.

use std::io::Cursor;

use crate::command::{CommandResult, Proposal};

openraft::declare_raft_types!(
    /// coord's openraft configuration.
    pub TypeConfig:
        D = Proposal,
        R = Vec<CommandResult>,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

/// A replica's id, as given by `--id`.
pub type NodeId = u64;
pub type Node = openraft::BasicNode;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type Raft = openraft::Raft<TypeConfig>;

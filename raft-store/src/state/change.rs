//! What an apply changed, reported to the server after the state changed: the server wakes the
//! calls parked on a key, task or barrier and feeds watches from these, without polling the state.
//!
//! The KV store and the coordination transitions both report through it; it uses only `cluster`'s
//! task names.

use bytes::Bytes;

use super::cluster::TaskName;

/// One effect of applying a command, reported to the server after the state changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    KvPut {
        key: String,
        value: Bytes,
        revision: u64,
    },
    KvDelete {
        key: String,
        revision: u64,
    },
    /// A task's state, incarnation or error changed.
    TaskChanged {
        task: TaskName,
    },
    /// A barrier instance started; the leader arms a timer for its deadline.
    BarrierStarted {
        id: String,
        counter: i64,
        deadline_ms: Option<u64>,
    },
    /// A barrier instance passed or failed; its waiters can be answered.
    BarrierDone {
        id: String,
        counter: i64,
    },
    /// An error entered the feed.
    ErrorRaised {
        seq: u64,
    },
    /// The cluster was set up.
    ClusterInitialized,
    /// A new run of the job began (see `runs`): the previous run's barriers and rounds are gone.
    RunStarted {
        number: u64,
    },
    /// A raw key's value or queue changed (see `crate::raw`): calls parked on it look again.
    RawChanged {
        key: Bytes,
    },
    /// `change` happened in namespace `namespace` (see `namespaces`); every change above is of
    /// the default namespace.
    InNamespace {
        namespace: String,
        change: Box<Change>,
    },
    /// A namespace was created.
    NamespaceDeclared {
        namespace: String,
    },
    /// A namespace was deleted: its parked calls, watches and leader duties end.
    NamespaceDeleted {
        namespace: String,
    },
}

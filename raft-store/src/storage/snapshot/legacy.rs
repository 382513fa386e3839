//! The snapshot formats older than [`FORMAT_VERSION`](super::FORMAT_VERSION), as they were
//! written, and how each reads as today's state.
//!
//! A replica upgraded in place, or a backup taken by an older build, hands [`super::decode`] the
//! bytes an older build wrote; every format ever written must keep reading. Each struct here is
//! frozen: it spells the fields of its format, in their order (bincode has no field names), and
//! is never changed once a newer format exists. A state of an older format becomes the default
//! namespace's [`Space`] of a state with no named namespace, with what it lacked left empty: format 1 as run 0, formats 1 and 2 with no
//! recoverable task, formats up to 3 with an empty tf.data dispatcher of TensorFlow's, formats up
//! to 4 with no quota until the leader sets one, and all of them with no raw key (torch's) in the
//! store. Their two dispatchers, coord's and TensorFlow's, become one
//! ([`crate::dispatcher::legacy::convert`]).
//!
//! This module knows only the state's records, not the snapshot file: `super` decides which
//! format a file holds and turns an [`OldBody`] into its snapshot body.

use serde::Deserialize;

use crate::dispatcher::legacy::{
    convert, coord::DispatcherState as Dispatcher, tf::TfDataState as TfData,
};
use crate::state::{
    AliveQueries, Barriers, Cluster, ClusterConfig, ErrorFeed, JobRuns,
    KvStoreBeforeRaw as KvStore, Quota, SessionTable, Space, TaskRegistry,
};
use crate::types::SnapshotMeta;

/// A snapshot of an older format: its Raft metadata, which no format has changed, and the state
/// as that format had it.
#[derive(Deserialize)]
pub(super) struct OldBody<S> {
    pub meta: SnapshotMeta,
    pub state: S,
}

/// A snapshot of format 1: the state without its runs.
pub(super) type SnapshotBodyV1 = OldBody<StateV1>;
/// A snapshot of format 2: runs, but no per-task recoverability.
pub(super) type SnapshotBodyV2 = OldBody<StateV2>;
/// A snapshot of format 3: no tf.data dispatcher of TensorFlow's.
pub(super) type SnapshotBodyV3 = OldBody<StateV3>;
/// A snapshot of format 4: no memory quota.
pub(super) type SnapshotBodyV4 = OldBody<StateV4>;
/// A snapshot of format 5: two dispatchers, and no raw key space in the store.
pub(super) type SnapshotBodyV5 = OldBody<StateV5>;
/// A snapshot of format 6: the default namespace's records alone, encoded as today's [`Space`]
/// (formats since encode it first, then the named namespaces).
pub(super) type SnapshotBodyV6 = OldBody<Space>;

/// The cluster of formats 1 and 2: without per-task recoverability.
#[derive(Deserialize)]
pub(super) struct ClusterV2 {
    config: ClusterConfig,
    service_incarnation: u64,
    tasks: TaskRegistry,
    barriers: Barriers,
    errors: ErrorFeed,
    alive: AliveQueries,
    task_version: u64,
}

impl From<ClusterV2> for Cluster {
    fn from(c: ClusterV2) -> Self {
        Cluster {
            config: c.config,
            service_incarnation: c.service_incarnation,
            tasks: c.tasks,
            barriers: c.barriers,
            errors: c.errors,
            alive: c.alive,
            task_version: c.task_version,
            recoverable_tasks: Default::default(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct StateV1 {
    kv: KvStore,
    sessions: SessionTable,
    cluster: Option<ClusterV2>,
    dispatcher: Dispatcher,
}

impl From<StateV1> for Space {
    fn from(v1: StateV1) -> Self {
        let StateV1 {
            kv,
            sessions,
            cluster,
            dispatcher,
        } = v1;
        Space {
            kv: kv.into(),
            sessions,
            cluster: cluster.map(Cluster::from),
            dispatcher: convert(dispatcher, Default::default()),
            runs: Default::default(),
            quota: Default::default(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct StateV2 {
    kv: KvStore,
    sessions: SessionTable,
    cluster: Option<ClusterV2>,
    dispatcher: Dispatcher,
    runs: JobRuns,
}

impl From<StateV2> for Space {
    fn from(v2: StateV2) -> Self {
        let StateV2 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
        } = v2;
        Space {
            kv: kv.into(),
            sessions,
            cluster: cluster.map(Cluster::from),
            dispatcher: convert(dispatcher, Default::default()),
            runs,
            quota: Default::default(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct StateV3 {
    kv: KvStore,
    sessions: SessionTable,
    cluster: Option<Cluster>,
    dispatcher: Dispatcher,
    runs: JobRuns,
}

impl From<StateV3> for Space {
    fn from(v3: StateV3) -> Self {
        let StateV3 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
        } = v3;
        Space {
            kv: kv.into(),
            sessions,
            cluster,
            dispatcher: convert(dispatcher, Default::default()),
            runs,
            quota: Default::default(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct StateV4 {
    kv: KvStore,
    sessions: SessionTable,
    cluster: Option<Cluster>,
    dispatcher: Dispatcher,
    runs: JobRuns,
    tfdata: TfData,
}

impl From<StateV4> for Space {
    fn from(v4: StateV4) -> Self {
        let StateV4 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
            tfdata,
        } = v4;
        Space {
            kv: kv.into(),
            sessions,
            cluster,
            dispatcher: convert(dispatcher, tfdata),
            runs,
            quota: Default::default(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct StateV5 {
    kv: KvStore,
    sessions: SessionTable,
    cluster: Option<Cluster>,
    dispatcher: Dispatcher,
    runs: JobRuns,
    tfdata: TfData,
    quota: Quota,
}

impl From<StateV5> for Space {
    fn from(v5: StateV5) -> Self {
        let StateV5 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
            tfdata,
            quota,
        } = v5;
        Space {
            kv: kv.into(),
            sessions,
            cluster,
            dispatcher: convert(dispatcher, tfdata),
            runs,
            quota,
        }
    }
}

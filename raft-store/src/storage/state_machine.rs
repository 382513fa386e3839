//! The state machine: openraft's [`RaftStateMachine`], implemented here and nowhere else.
//!
//! The state lives in memory; what is durable is the log (see `log_store`) and the latest snapshot.
//! On start the state is loaded from the snapshot and openraft re-applies the committed entries
//! after it (the log store keeps the committed id for that), so no acknowledged write depends on
//! the state machine being on disk. Applying in memory keeps apply off the fsync path.
//!
//! Readers (the gRPC handlers) share the state through a [`StateReader`]; the lock is a std
//! `RwLock` because nobody holds it across an `.await`.

use std::io::Cursor;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};

use crate::command::CommandResult;
use crate::state::{Change, CoordState};
use crate::types::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
};

use super::snapshot::{self, SnapshotBody, SnapshotDir};

/// Told about every applied batch, after the state lock is released. The server wakes parked
/// calls and feeds watches from here.
pub trait ApplyListener: Send + Sync + 'static {
    /// Entries up to `last` were applied and made `changes` (in order).
    fn applied(&self, last: LogId, changes: &[Change]);
    /// The whole state was replaced by an installed snapshot.
    fn replaced(&self, last: Option<LogId>);
}

/// The applied state with the Raft bookkeeping that must move with it.
#[derive(Debug, Default, Clone)]
pub struct Applied {
    pub state: CoordState,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

/// Shared read access to the applied state.
#[derive(Clone, Default)]
pub struct StateReader {
    inner: Arc<RwLock<Applied>>,
    /// How long applying a batch of committed entries takes (state change and wake-ups).
    apply_latency: Arc<crate::stats::Histogram>,
}

impl StateReader {
    pub fn apply_latency(&self) -> &crate::stats::Histogram {
        &self.apply_latency
    }

    /// Runs `f` on the current state. Keep `f` short: apply waits while it runs.
    pub fn read<R>(&self, f: impl FnOnce(&Applied) -> R) -> R {
        f(&self.lock_read())
    }

    fn lock_read(&self) -> RwLockReadGuard<'_, Applied> {
        // apply never panics while holding the lock; if it ever did, the state it left is still
        // the state to report, so poisoning is not a reason to stop serving.
        self.inner.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_write(&self) -> RwLockWriteGuard<'_, Applied> {
        self.inner.write().unwrap_or_else(PoisonError::into_inner)
    }
}

pub struct StateMachineStore {
    reader: StateReader,
    snapshots: Arc<SnapshotDir>,
    listener: Arc<dyn ApplyListener>,
}

fn sm_err<E: std::error::Error + 'static>(e: E) -> StorageError {
    StorageIOError::write_state_machine(openraft::AnyError::new(&e)).into()
}

impl StateMachineStore {
    /// Opens the snapshot directory and loads the latest snapshot, if any; a restored replica
    /// without one starts from its base state (see [`super::backup`]).
    pub(crate) fn open(
        snapshots: SnapshotDir,
        listener: Arc<dyn ApplyListener>,
    ) -> Result<Self, snapshot::SnapshotError> {
        let reader = StateReader::default();
        if let Some(body) = snapshots.load()? {
            let mut g = reader.lock_write();
            g.state = body.state;
            g.last_applied = body.meta.last_log_id;
            g.membership = body.meta.last_membership;
        } else if let Some(base) = snapshots.load_base()? {
            tracing::info!(
                keys = base.state.kv.len(),
                revision = base.state.kv.revision(),
                "starting from the restored base state"
            );
            reader.lock_write().state = base.state;
        }
        Ok(Self {
            reader,
            snapshots: Arc::new(snapshots),
            listener,
        })
    }

    pub fn reader(&self) -> StateReader {
        self.reader.clone()
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok(self.reader.read(|a| (a.last_applied, a.membership.clone())))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<CommandResult>>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = std::time::Instant::now();
        let mut results = Vec::new();
        let mut changes = Vec::new();
        let last = {
            let mut g = self.reader.lock_write();
            for entry in entries {
                g.last_applied = Some(entry.log_id);
                results.push(match entry.payload {
                    EntryPayload::Blank => Vec::new(),
                    EntryPayload::Normal(proposal) => g.state.apply(&proposal, &mut changes),
                    EntryPayload::Membership(m) => {
                        g.membership = StoredMembership::new(Some(entry.log_id), m);
                        Vec::new()
                    }
                });
            }
            g.last_applied
        };
        if let Some(last) = last {
            self.listener.applied(last, &changes);
        }
        self.reader.apply_latency.record(started.elapsed());
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            reader: self.reader.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        tracing::info!(snapshot = %meta.snapshot_id, bytes = bytes.len(), last = ?meta.last_log_id, "installing a snapshot received from the leader");
        let origin = format!("{} received from the leader", meta.snapshot_id);
        let body = snapshot::decode(&bytes, &origin).map_err(|e| {
            StorageIOError::read_snapshot(Some(meta.signature()), openraft::AnyError::new(&e))
        })?;
        if body.meta.last_log_id != meta.last_log_id {
            let e = snapshot::SnapshotError::Corrupt {
                origin,
                reason: format!(
                    "contents end at {:?} but the leader announced {:?}",
                    body.meta.last_log_id, meta.last_log_id
                ),
            };
            return Err(StorageIOError::read_snapshot(
                Some(meta.signature()),
                openraft::AnyError::new(&e),
            )
            .into());
        }
        let snapshots = self.snapshots.clone();
        tokio::task::spawn_blocking(move || snapshots.replace(&bytes))
            .await
            .map_err(sm_err)?
            .map_err(|e| {
                StorageIOError::write_snapshot(Some(meta.signature()), openraft::AnyError::new(&e))
            })?;
        {
            let mut g = self.reader.lock_write();
            g.state = body.state;
            g.last_applied = meta.last_log_id;
            g.membership = meta.last_membership.clone();
        }
        self.listener.replaced(meta.last_log_id);
        tracing::info!(snapshot = %meta.snapshot_id, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let snapshots = self.snapshots.clone();
        let bytes = tokio::task::spawn_blocking(move || snapshots.read())
            .await
            .map_err(sm_err)?
            .map_err(|e| StorageIOError::read_snapshot(None, openraft::AnyError::new(&e)))?;
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let body = snapshot::decode(&bytes, "the stored snapshot")
            .map_err(|e| StorageIOError::read_snapshot(None, openraft::AnyError::new(&e)))?;
        Ok(Some(Snapshot {
            meta: body.meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}

/// Builds a snapshot from a copy of the state, taken under the read lock, so apply goes on while
/// the copy is encoded and written.
pub struct SnapshotBuilder {
    reader: StateReader,
    snapshots: Arc<SnapshotDir>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let applied = self.reader.read(Applied::clone);
        let snapshot_id = match applied.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id.term, l.leader_id.node_id, l.index),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership,
            snapshot_id,
        };
        let body = SnapshotBody {
            meta: meta.clone(),
            state: applied.state,
        };
        let snapshots = self.snapshots.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            let bytes = snapshot::encode(&body).map_err(sm_err)?;
            snapshots.replace(&bytes).map_err(|e| {
                StorageError::from(StorageIOError::write_snapshot(
                    None,
                    openraft::AnyError::new(&e),
                ))
            })?;
            Ok::<_, StorageError>(bytes)
        })
        .await
        .map_err(sm_err)??;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

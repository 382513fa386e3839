//! The durable side of a replica: where the Raft log, the vote and the snapshots live.
//!
//! - [`engine`]: what holds the log, as the log store sees it, and which engine a data
//!   directory was made with ([`RaftLogEngine`], `--raft-log`).
//! - [`segments`]: the default engine's file format; [`wal`]: its writer, reader and recovery,
//!   over the in-memory index of `log_index`.
//! - `sled_log`: the other engine, the log in a sled database.
//! - [`flusher`]: group commit; the only place that syncs the log to disk.
//! - [`log_store`]: openraft's `RaftLogStorage` over either engine.
//! - [`witness`]: what the log must at least contain, kept beside it to catch damage.
//! - [`snapshot`]: the checksummed snapshot file, which reads every older format too;
//!   [`files`]: self-checking atomic files.
//! - [`backup`]: backup files, and the base state a restored replica starts from.
//! - [`state_machine`]: openraft's `RaftStateMachine` over the in-memory [`crate::CoordState`].
//!
//! A data directory holds `raft/` (`log-engine`, the log segments or sled's `sled/`, and
//! `witness.bin`) and `snapshots/`.

pub mod backup;
pub mod engine;
pub mod files;
pub mod flusher;
mod log_index;
pub mod log_store;
pub mod pre_append;
pub mod segments;
mod sled_log;
pub mod snapshot;
pub mod state_machine;
pub mod wal;
pub mod witness;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use engine::RaftLogEngine;
pub use flusher::SyncHook;
pub use log_store::LogStore;
pub use snapshot::SnapshotError;
pub use state_machine::{Applied, ApplyListener, StateMachineStore, StateReader};

/// The snapshot directory in a data directory.
pub const SNAPSHOT_DIR: &str = "snapshots";

/// How to open a replica's storage.
#[derive(Clone, Default)]
pub struct StoreOptions {
    /// The engine of a new log; an existing log must have been made with it.
    pub log_engine: RaftLogEngine,
    /// Called before every sync (tests, fault injection).
    pub sync_hook: Option<Arc<dyn SyncHook>>,
}

/// Why a data directory could not be opened. Every variant names the path involved.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create data directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the log flusher for {path}: {source}")]
    Flusher {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the Raft log in {path} was made with the {recorded} engine, but this coordinator was started with --raft-log {requested}: start it with --raft-log {recorded} (a data directory keeps the log engine it was created with; coord does not convert one into the other)")]
    OtherEngine {
        path: PathBuf,
        recorded: RaftLogEngine,
        requested: RaftLogEngine,
    },
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("the data in {path} is damaged: {reason}; this replica must not run on it (restore it, or remove the replica from the ensemble and add it back empty)")]
    Damaged { path: PathBuf, reason: String },
}

/// A replica's storage, opened and checked.
pub struct Opened {
    pub log: LogStore,
    pub state_machine: StateMachineStore,
    /// The Raft directory was created by this open (no witness existed): a replica's first start,
    /// or its Raft state was deleted.
    pub fresh: bool,
}

/// Opens (creating if needed) the storage of one replica in `data_dir`.
pub fn open(
    data_dir: &Path,
    options: StoreOptions,
    listener: Arc<dyn ApplyListener>,
) -> Result<Opened, OpenError> {
    std::fs::create_dir_all(data_dir).map_err(|source| OpenError::CreateDir {
        path: data_dir.to_path_buf(),
        source,
    })?;
    let raft_dir = data_dir.join("raft");
    let damaged = |reason: String| OpenError::Damaged {
        path: raft_dir.clone(),
        reason,
    };
    std::fs::create_dir_all(&raft_dir).map_err(|source| OpenError::CreateDir {
        path: raft_dir.clone(),
        source,
    })?;
    if raft_dir.join("db").exists() && segments::list(&raft_dir).is_ok_and(|s| s.is_empty()) {
        return Err(damaged(
            "it holds a Raft log in the sled format of an older coord (raft/db), which this version does not read".into(),
        ));
    }
    let requested = options.log_engine;
    engine::settle(&raft_dir, requested).map_err(|refusal| match refusal {
        engine::Refusal::Other(recorded) => OpenError::OtherEngine {
            path: raft_dir.clone(),
            recorded,
            requested,
        },
        engine::Refusal::Damaged(reason) => damaged(reason),
    })?;
    let (witness, witnessed) = witness::Witness::open(&raft_dir).map_err(damaged)?;
    let (log, files) = open_engine(&raft_dir, requested).map_err(damaged)?;
    let witness = Arc::new(witness);
    let positions = Arc::new(flusher::LogPositions::default());
    let target =
        flusher::SyncTarget::new(files, options.sync_hook, witness.clone(), positions.clone());
    let flusher = flusher::Flusher::start(target).map_err(|source| OpenError::Flusher {
        path: raft_dir.clone(),
        source,
    })?;
    let log_store = LogStore::new(log, flusher, witness, positions);
    let snapshots = snapshot::SnapshotDir::open(&data_dir.join(SNAPSHOT_DIR))?;
    let state_machine = StateMachineStore::open(snapshots, listener)?;
    check_consistency(&log_store, &state_machine, witnessed.as_ref()).map_err(damaged)?;
    let fresh = witnessed.is_none();
    if fresh {
        // From now on this directory is known to hold Raft state; losing it is detectable.
        log_store
            .init_witness()
            .map_err(|e| damaged(format!("cannot write the witness: {e}")))?;
    }
    Ok(Opened {
        log: log_store,
        state_machine,
        fresh,
    })
}

/// Opens the log in `raft_dir` with `engine`, and what syncs it.
fn open_engine(raft_dir: &Path, engine: RaftLogEngine) -> Result<engine::OpenEngine, String> {
    match engine {
        RaftLogEngine::Segments => {
            let (wal, recovered) = wal::Wal::open(raft_dir)?;
            if let Some((file, what)) = &recovered.torn_tail {
                tracing::warn!(file = %file.display(), damage = %what, "cut a torn write off the end of the Raft log (a crash before it was synced)");
            }
            let files = wal.syncer();
            Ok((Box::new(wal), Box::new(files)))
        }
        RaftLogEngine::Sled => {
            let (log, files) = sled_log::SledLog::open(&raft_dir.join(engine::SLED_DIR))?;
            Ok((Box::new(log), Box::new(files)))
        }
    }
}

/// Refuses storage that lost something it once held: the log must agree with the witness, and a log
/// purged past its start needs the snapshot that replaced it.
fn check_consistency(
    log: &LogStore,
    sm: &StateMachineStore,
    witnessed: Option<&witness::WitnessState>,
) -> Result<(), String> {
    let vote = log.stored_vote();
    let (purged, last) = log.log_bounds();
    match witnessed {
        None if vote.is_some() || last.is_some() => {
            return Err("the Raft log has data but its witness file is missing".into());
        }
        None => {}
        Some(w) => {
            if let Some(witnessed_vote) = &w.vote {
                if vote.as_ref().is_none_or(|v| v < witnessed_vote) {
                    return Err(format!(
                        "the log's vote ({}) is older than the vote this replica last cast ({witnessed_vote}): the log lost writes",
                        vote.map_or("none".to_string(), |v| v.to_string())
                    ));
                }
            }
            let last_index = last.map_or(0, |l| l.index);
            if last_index < w.committed_index {
                return Err(format!(
                    "the log ends at index {last_index} but entries up to {} were committed and on disk",
                    w.committed_index
                ));
            }
        }
    }
    let applied = sm.reader().read(|a| a.last_applied.map_or(0, |l| l.index));
    if let Some(p) = purged {
        if applied < p.index {
            return Err(format!(
                "the log was purged up to index {} but the snapshot only reaches {applied} (snapshot missing?)",
                p.index
            ));
        }
    }
    Ok(())
}

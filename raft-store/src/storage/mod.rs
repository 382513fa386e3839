//! The durable side of a replica: where the Raft log, the vote and the snapshots live.
//!
//! - [`flusher`]: group commit; the only place that syncs the log to disk.
//! - [`log_store`]: openraft's `RaftLogStorage` on sled.
//! - [`witness`]: what the log must at least contain, kept outside sled to catch damage.
//! - [`snapshot`]: the checksummed snapshot file; [`files`]: self-checking atomic files.
//! - [`state_machine`]: openraft's `RaftStateMachine` over the in-memory [`crate::CoordState`].
//!
//! A data directory holds `raft/` (the sled database and `witness.bin`) and `snapshots/`.

pub mod files;
pub mod flusher;
pub mod log_store;
pub mod snapshot;
pub mod state_machine;
pub mod witness;

use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use flusher::SyncHook;
pub use log_store::LogStore;
pub use snapshot::SnapshotError;
pub use state_machine::{Applied, ApplyListener, StateMachineStore, StateReader};

/// How to open a replica's storage.
#[derive(Clone)]
pub struct StoreOptions {
    /// sled's page cache size. The log is append-mostly and read back soon after, so a modest
    /// cache does; sled's 1 GiB default is far more than a coordinator needs.
    pub cache_capacity_bytes: u64,
    /// Called before every sync (tests, fault injection).
    pub sync_hook: Option<Arc<dyn SyncHook>>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            cache_capacity_bytes: 64 << 20,
            sync_hook: None,
        }
    }
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
    #[error("cannot open the Raft log at {path} (is another coordinator using this data directory, or is it damaged?): {source}")]
    Sled {
        path: PathBuf,
        #[source]
        source: sled::Error,
    },
    #[error("cannot start the log flusher for {path}: {source}")]
    Flusher {
        path: PathBuf,
        #[source]
        source: std::io::Error,
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
    let sled_err = |source| OpenError::Sled {
        path: raft_dir.clone(),
        source,
    };
    let db = sled::Config::new()
        .path(&raft_dir)
        .cache_capacity(options.cache_capacity_bytes)
        // sled writes any page larger than a quarter segment to a separate blob file; with 8 MiB
        // segments a leaf of batched entries stays inline (see the flusher's blob handling).
        .segment_size(flusher::SEGMENT_SIZE)
        // The flusher syncs on every write that needs it; sled's own periodic flush would only
        // add fsyncs competing with it.
        .flush_every_ms(None)
        .open()
        .map_err(sled_err)?;
    let damaged = |reason: String| OpenError::Damaged {
        path: raft_dir.clone(),
        reason,
    };
    let (witness, witnessed) = witness::Witness::open(&raft_dir).map_err(damaged)?;
    let witness = Arc::new(witness);
    let positions = Arc::new(flusher::LogPositions::default());
    let flusher_err = |source| OpenError::Flusher {
        path: raft_dir.clone(),
        source,
    };
    let target = flusher::SyncTarget::open(
        db.clone(),
        &raft_dir,
        options.sync_hook,
        witness.clone(),
        positions.clone(),
    )
    .map_err(flusher_err)?;
    let flusher = flusher::Flusher::start(target).map_err(flusher_err)?;
    let log_store =
        LogStore::new(&db, flusher, witness, positions).map_err(|e| damaged(e.to_string()))?;
    let snapshots = snapshot::SnapshotDir::open(&data_dir.join("snapshots"))?;
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

/// Refuses storage that lost something it once held: sled must agree with the witness, and a log
/// purged past its start needs the snapshot that replaced it.
fn check_consistency(
    log: &LogStore,
    sm: &StateMachineStore,
    witnessed: Option<&witness::WitnessState>,
) -> Result<(), String> {
    let vote = log.stored_vote().map_err(|e| e.to_string())?;
    let (purged, last) = log.log_bounds().map_err(|e| e.to_string())?;
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

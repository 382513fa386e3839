//! What a replica checks and prepares before it serves: its ports, its Raft configuration, what
//! its log held at start, and the errors that stop it from starting (each names what to fix);
//! and the loop that follows its leader changes once it runs.

use std::net::SocketAddr;
use std::sync::Arc;

use coord_raft_store::storage::{LogStore, OpenError};
use coord_raft_store::types::Raft;
use openraft::storage::RaftLogStorage;
use openraft::{Config, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;

use crate::ops::config::Args;
use crate::ops::identity::IdentityError;
use crate::ops::metrics::Metrics;
use crate::raft::leader::StartFloor;
use crate::serve::apply_hub::ApplyHub;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid flags: {0}")]
    Config(String),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        addr: SocketAddr,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Locked(#[from] crate::ops::data_lock::LockError),
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error("cannot read the Raft log in {dir}: {source}")]
    Log {
        dir: String,
        #[source]
        source: Box<coord_raft_store::types::StorageError>,
    },
    #[error("cannot start Raft: {0}")]
    Raft(String),
    #[error("TLS: {0}")]
    Tls(String),
}

pub(super) fn raft_config(args: &Args) -> Result<Config, StartError> {
    Config {
        cluster_name: args.cluster_token.clone(),
        heartbeat_interval: args.heartbeat_ms,
        election_timeout_min: args.election_timeout_min_ms,
        election_timeout_max: args.election_timeout_max_ms,
        // A snapshot of a large key-value store takes longer than openraft's 200 ms default.
        install_snapshot_timeout: 10_000,
        // Small chunks: each one renews the receiver's view of its leader, so a long transfer
        // never lets its election timer run out between two chunks (openraft's 3 MiB default
        // took longer than an election timeout per chunk here, and every election restarted the
        // transfer from the beginning).
        snapshot_max_chunk_size: 256 << 10,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(args.snapshot_every_entries),
        max_in_snapshot_log_to_keep: 1_000,
        ..Config::default()
    }
    .validate()
    .map_err(|e| StartError::Config(e.to_string()))
}

/// What the log held when the replica started.
pub(super) struct LogAtStart {
    /// No entry and no vote: a replica that never took part.
    pub pristine: bool,
    /// The term of the persisted vote and the last durable index (see [`StartFloor`]).
    pub floor: StartFloor,
}

pub(super) async fn log_at_start(log: &LogStore, dir: &str) -> Result<LogAtStart, StartError> {
    let mut log = log.clone();
    let err = |source| StartError::Log {
        dir: dir.to_string(),
        source: Box::new(source),
    };
    let state = log.get_log_state().await.map_err(err)?;
    let vote = log.read_vote().await.map_err(err)?;
    let committed = log.read_committed().await.map_err(err)?;
    tracing::info!(
        last_log = ?state.last_log_id,
        ?committed,
        ?vote,
        "log at start"
    );
    Ok(LogAtStart {
        pristine: state.last_log_id.is_none() && vote.is_none(),
        floor: StartFloor {
            term: vote.map_or(0, |v| v.leader_id().term),
            index: state.last_log_id.map_or(0, |l| l.index),
        },
    })
}

/// Binds a listener, naming what it is for in the error.
pub async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, what, source })
}

/// Logs every leader change, counts it, and fails parked calls when this replica stops leading.
pub(super) async fn watch_leadership(raft: Raft, hub: Arc<ApplyHub>, metrics: Arc<Metrics>) {
    let mut rx = raft.metrics();
    let mut last_leader = None;
    let mut was_leader = false;
    loop {
        let (leader, term, state) = {
            let m = rx.borrow_and_update();
            (m.current_leader, m.current_term, m.state)
        };
        if leader != last_leader {
            tracing::info!(from = ?last_leader, to = ?leader, term, "leader changed");
            metrics
                .leader_changes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            last_leader = leader;
        }
        let is_leader = state == ServerState::Leader;
        if was_leader && !is_leader {
            tracing::info!(
                parked = hub.parked(),
                "lost leadership; failing parked calls so they re-drive"
            );
            hub.leadership_lost();
        }
        was_leader = is_leader;
        if rx.changed().await.is_err() {
            return;
        }
    }
}

//! `coord.admin.Admin/Backup`: the leader's whole state at a linearizable point, as a backup file
//! (see `coord_raft_store::storage::backup`), streamed in pieces.
//!
//! The state is copied under the read lock (values are shared, not copied) so apply goes on while
//! the copy is encoded; the copy includes every write acknowledged before the call began, since
//! the leader confirms its leadership first and reads its applied state after.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use coord_proto::coord::admin as pb;
use coord_raft_store::storage::backup::Backup;
use futures::Stream;
use tonic::Status;

use crate::error::CoordError;
use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::coordination::CoordCore;

/// The pieces a backup is streamed in.
const CHUNK_BYTES: usize = 1 << 20;

pub type BackupStream = Pin<Box<dyn Stream<Item = Result<pb::BackupChunk, Status>> + Send>>;

/// Takes a backup on this replica, which must lead.
pub async fn take(
    core: &Arc<CoordCore>,
    leader: &LeaderWatch,
    me: u64,
    cluster_id: u64,
) -> Result<BackupStream, Status> {
    let leadership = leader.current();
    if leadership != Leadership::Me {
        return Err(CoordError::NotLeader {
            me,
            leader: leadership.hint(),
        }
        .into());
    }
    core.read_index.linearize().await?;
    // The whole state: every namespace.
    let (state, applied) = core
        .reader
        .all()
        .read(|a| (a.state.clone(), a.last_applied.map_or(0, |l| l.index)));
    let (keys, revision) = (state.kv.len() as u64, state.kv.revision());
    let taken_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let id = rand::random::<u64>();
    let bytes = tokio::task::spawn_blocking(move || {
        Backup::of(state, id, cluster_id, taken_at_ms, applied).and_then(|b| b.encode())
    })
    .await
    .map_err(|e| Status::internal(format!("the backup's encoder failed: {e}")))?
    .map_err(|e| Status::internal(format!("cannot encode the backup: {e}")))?;
    tracing::info!(
        backup = format!("{id:016x}"),
        bytes = bytes.len(),
        applied_index = applied,
        "backup taken"
    );
    let bytes = bytes::Bytes::from(bytes);
    let chunks: Vec<Result<pb::BackupChunk, Status>> = (0..bytes.len())
        .step_by(CHUNK_BYTES)
        .map(|at| {
            let data = bytes.slice(at..bytes.len().min(at + CHUNK_BYTES));
            Ok(match at {
                0 => pb::BackupChunk {
                    data,
                    backup_id: id,
                    applied_index: applied,
                    keys,
                    revision,
                    total_bytes: bytes.len() as u64,
                },
                _ => pb::BackupChunk {
                    data,
                    ..Default::default()
                },
            })
        })
        .collect();
    Ok(Box::pin(tokio_stream::iter(chunks)))
}

//! Backups: a consistent copy of the whole replicated state that an operator keeps
//! (`coordctl snapshot save FILE`), and the base a new ensemble starts from
//! (`coordinator --restore FILE`).
//!
//! A backup file is a [`files`](super::files) frame with magic `COORDBAK` (its own CRC-32 over
//! everything) around a [`Backup`]: where it came from, and the state as a snapshot file of its
//! own format (so a newer build reads an older backup as it reads an older snapshot). The state
//! carries no Raft position: a restored ensemble is a new ensemble, whose log starts at index 0 on
//! top of it.
//!
//! Restoring copies the state into `snapshots/base.bin` of each new replica's data directory. A
//! replica with no snapshot of its own starts from that base instead of from an empty state, and
//! replays its log on top of it; every replica of the restored ensemble (and every replica that
//! joins it) holds the same base, so they all reach the same state. The first snapshot a replica
//! takes covers the base, and from then on the base is not read.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::files;
use super::snapshot::{self, SnapshotBody, SnapshotError, BASE_FILE};
use crate::codec;
use crate::state::CoordState;
use crate::types::SnapshotMeta;

const MAGIC: &[u8; 8] = b"COORDBAK";
const FORMAT_VERSION: u32 = 1;

/// What a backup file holds.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Backup {
    /// Random, chosen when the backup was taken; a restored ensemble's identity is derived from
    /// it, so two ensembles restored from different backups (or the original) never mix.
    pub id: u64,
    /// The cluster id of the ensemble it was taken from.
    pub source_cluster_id: u64,
    /// When the leader took it (ms since the Unix epoch).
    pub taken_at_ms: u64,
    /// The source's last applied log index covered by the state.
    pub applied_index: u64,
    /// The state, as a snapshot file with no Raft position.
    pub snapshot: Vec<u8>,
}

impl Backup {
    /// A backup of `state`.
    pub fn of(
        state: CoordState,
        id: u64,
        source_cluster_id: u64,
        taken_at_ms: u64,
        applied_index: u64,
    ) -> Result<Self, codec::CodecError> {
        let body = SnapshotBody {
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: Default::default(),
                snapshot_id: format!("backup-{id:016x}"),
            },
            state,
        };
        Ok(Self {
            id,
            source_cluster_id,
            taken_at_ms,
            applied_index,
            snapshot: snapshot::encode(&body)?,
        })
    }

    pub fn encode(&self) -> Result<Vec<u8>, codec::CodecError> {
        Ok(files::frame(
            MAGIC,
            FORMAT_VERSION,
            &codec::encode("backup", self)?,
        ))
    }

    /// Checks and decodes a backup file's bytes, the state inside included; `origin` names the
    /// file for errors. Returns the backup and its state.
    pub fn decode(bytes: &[u8], origin: &str) -> Result<(Self, CoordState), SnapshotError> {
        let corrupt = |reason: String| SnapshotError::Corrupt {
            origin: origin.to_string(),
            reason,
        };
        let body = files::unframe(MAGIC, FORMAT_VERSION, bytes)
            .map_err(|e| corrupt(format!("not a coord backup: {e}")))?;
        let backup: Backup = codec::decode("backup", body).map_err(|e| corrupt(e.to_string()))?;
        let inner = snapshot::decode(&backup.snapshot, origin)?;
        if inner.meta.last_log_id.is_some() {
            return Err(corrupt("its state carries a Raft position".into()));
        }
        Ok((backup, inner.state))
    }

    /// The CRC-32 of the whole file, as operators compare it.
    pub fn checksum(bytes: &[u8]) -> u32 {
        crc32fast::hash(bytes)
    }

    /// Durably writes this backup's state as the base a replica in `data_dir` starts from.
    pub fn write_base(&self, data_dir: &Path) -> Result<(), SnapshotError> {
        let dir = data_dir.join(super::SNAPSHOT_DIR);
        let io = |source| SnapshotError::Io {
            path: dir.join(BASE_FILE),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(io)?;
        files::write_atomically(&dir, BASE_FILE, &self.snapshot).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Op, Proposal};

    #[test]
    fn a_backup_round_trips_and_damage_is_caught() {
        let mut state = CoordState::default();
        state.apply(
            &Proposal::new(
                1,
                vec![Command {
                    request: None,
                    op: Op::KvPut {
                        key: "k".into(),
                        value: bytes::Bytes::from("v"),
                        overwrite: false,
                    },
                }],
            ),
            &mut Vec::new(),
        );
        let bytes = Backup::of(state.clone(), 7, 9, 11, 13)
            .and_then(|b| b.encode())
            .expect("encode");
        let (backup, read) = Backup::decode(&bytes, "test").expect("decode");
        assert_eq!(
            (backup.id, backup.source_cluster_id, backup.applied_index),
            (7, 9, 13)
        );
        assert_eq!(read, state);
        let mut damaged = bytes.clone();
        let mid = damaged.len() / 2;
        damaged[mid] ^= 1;
        let err = Backup::decode(&damaged, "test").expect_err("damaged");
        assert!(err.to_string().contains("checksum"), "{err}");
        let err = Backup::decode(b"not a backup at all", "f").expect_err("garbage");
        assert!(err.to_string().contains("not a coord backup"), "{err}");
    }
}

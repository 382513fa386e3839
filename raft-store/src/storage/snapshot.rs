//! Snapshot files: the whole state plus its Raft metadata, checksummed, replaced atomically.
//!
//! One file, `snapshot.bin`, holds the current snapshot. A new one is written to a temporary
//! file, synced, renamed over the old and the directory synced, so a crash leaves either the old
//! or the new snapshot, never a torn one. The file's bytes are also exactly what the leader ships
//! to a follower, so the follower checks the same checksum before it installs anything.
//!
//! Format: a [`files`](super::files) frame with magic `COORDSNP` around the encoded
//! [`SnapshotBody`].

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::state::CoordState;
use crate::types::SnapshotMeta;

use super::files;

const MAGIC: &[u8; 8] = b"COORDSNP";
const FORMAT_VERSION: u32 = 1;
const FILE_NAME: &str = "snapshot.bin";

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("snapshot {origin} is corrupt: {reason}")]
    Corrupt { origin: String, reason: String },
}

#[derive(Serialize, Deserialize)]
pub(crate) struct SnapshotBody {
    pub meta: SnapshotMeta,
    pub state: CoordState,
}

/// Encodes a snapshot into the bytes that are both stored and shipped.
pub(crate) fn encode(body: &SnapshotBody) -> Result<Vec<u8>, codec::CodecError> {
    Ok(files::frame(
        MAGIC,
        FORMAT_VERSION,
        &codec::encode("snapshot", body)?,
    ))
}

/// Checks and decodes snapshot bytes; `origin` names where they came from, for the error.
pub(crate) fn decode(bytes: &[u8], origin: &str) -> Result<SnapshotBody, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::Corrupt {
        origin: origin.to_string(),
        reason,
    };
    let body = files::unframe(MAGIC, FORMAT_VERSION, bytes).map_err(corrupt)?;
    codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))
}

/// The directory holding the current snapshot file.
pub(crate) struct SnapshotDir {
    dir: PathBuf,
}

impl SnapshotDir {
    pub(crate) fn open(dir: &Path) -> Result<Self, SnapshotError> {
        fs::create_dir_all(dir).map_err(|source| SnapshotError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// The current snapshot's bytes, if there is one.
    pub(crate) fn read(&self) -> Result<Option<Vec<u8>>, SnapshotError> {
        let path = self.path();
        files::read_if_exists(&path).map_err(|source| SnapshotError::Io { path, source })
    }

    /// Reads and checks the current snapshot.
    pub(crate) fn load(&self) -> Result<Option<SnapshotBody>, SnapshotError> {
        match self.read()? {
            None => Ok(None),
            Some(bytes) => decode(&bytes, &self.path().display().to_string()).map(Some),
        }
    }

    /// Durably replaces the current snapshot with `bytes` (already encoded and checked).
    pub(crate) fn replace(&self, bytes: &[u8]) -> Result<(), SnapshotError> {
        files::write_atomically(&self.dir, FILE_NAME, bytes).map_err(|source| SnapshotError::Io {
            path: self.path(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::StoredMembership;

    fn body() -> SnapshotBody {
        SnapshotBody {
            meta: SnapshotMeta {
                last_log_id: None,
                last_membership: StoredMembership::default(),
                snapshot_id: "t".into(),
            },
            state: CoordState::default(),
        }
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let bytes = encode(&body()).expect("encode");
        assert!(decode(&bytes, "t").is_ok());
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert!(matches!(
            decode(&flipped, "t"),
            Err(SnapshotError::Corrupt { .. })
        ));
        assert!(decode(&bytes[..bytes.len() - 1], "t").is_err(), "truncated");
        assert!(decode(b"short", "t").is_err());
    }

    /// A snapshot body that is well framed (the checksum recomputed, as a hostile or buggy peer
    /// could) but mutated inside: decoding never panics, whatever the bytes.
    #[test]
    fn fuzz_mutated_snapshot_bodies_never_panic() {
        use crate::{Command, Op, Proposal};
        let mut state = CoordState::default();
        let mut changes = Vec::new();
        let commands = (0..40u64)
            .map(|i| Command {
                request: None,
                op: Op::KvPut {
                    key: format!("k/{}", i % 13),
                    value: bytes::Bytes::from(vec![i as u8; (i % 9) as usize]),
                    overwrite: true,
                },
            })
            .collect();
        state.apply(&Proposal::new(1, commands), &mut changes);
        let body = SnapshotBody { state, ..body() };
        let clean = codec::encode("snapshot", &body).expect("encode");
        let mut next = coord_proto::fuzz::xorshift(0x00C0_FFEE_5EED);
        let (mut ok, mut err) = (0, 0);
        for _ in 0..5_000 {
            let mut b = clean.clone();
            match next() % 4 {
                0 => {
                    let at = (next() as usize) % b.len();
                    b[at] ^= 1 << (next() % 8);
                }
                1 => b.truncate((next() as usize) % b.len()),
                2 => {
                    let at = (next() as usize) % b.len();
                    for v in b.iter_mut().skip(at).take(8) {
                        *v = 0xff;
                    }
                }
                _ => {
                    let at = (next() as usize) % b.len();
                    b.insert(at, next() as u8);
                }
            }
            match decode(&files::frame(MAGIC, FORMAT_VERSION, &b), "fuzz") {
                Ok(_) => ok += 1,
                Err(_) => err += 1,
            }
        }
        assert!(
            err > 1_000,
            "only {err} of 5,000 mutations were refused ({ok} decoded)"
        );
    }

    #[test]
    fn replace_is_atomic_and_readable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let snaps = SnapshotDir::open(dir.path()).expect("open");
        assert!(snaps.load().expect("load").is_none());
        let bytes = encode(&body()).expect("encode");
        snaps.replace(&bytes).expect("replace");
        assert_eq!(snaps.read().expect("read"), Some(bytes));
        assert!(!dir.path().join("snapshot.bin.tmp").exists());
    }
}

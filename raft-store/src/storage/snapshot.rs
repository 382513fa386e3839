//! Snapshot files: the whole state plus its Raft metadata, checksummed, replaced atomically.
//!
//! One file, `snapshot.bin`, holds the current snapshot. A new one is written to a temporary
//! file, synced, renamed over the old and the directory synced, so a crash leaves either the old
//! or the new snapshot, never a torn one. The file's bytes are also exactly what the leader ships
//! to a follower, so the follower checks the same checksum before it installs anything.
//!
//! Format: a [`files`](super::files) frame with magic `COORDSNP` around the encoded
//! [`SnapshotBody`]. Version 2 added the job's runs at the end of the state, version 3 per-task
//! recoverability, version 4 TensorFlow's tf.data dispatcher, version 5 the memory quota, version
//! 6 made the two dispatchers one and gave the store its raw key space (torch's keys), version 7
//! added the named namespaces after the default namespace's records (see `state::namespaces`);
//! older
//! snapshots still read (as run 0, with no recoverable task, with an empty tf.data dispatcher,
//! with no quota until the leader sets one, with their dispatchers made one by
//! `dispatcher::legacy::convert`, with no raw key, with no named namespace).
//!
//! - [`legacy`]: the older formats' layouts, frozen, and how each reads as today's state.
//! - `tests`: every format still reads; damage is caught and never panics the reader.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::state::{CoordState, Space};
use crate::types::SnapshotMeta;

use super::files;

mod legacy;

const MAGIC: &[u8; 8] = b"COORDSNP";
const FORMAT_VERSION: u32 = 7;
const FILE_NAME: &str = "snapshot.bin";
/// The base a restored replica starts from, beside the current snapshot: written by
/// [`super::backup`], read here when there is no snapshot yet.
pub const BASE_FILE: &str = "base.bin";

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
    match files::version_of(bytes) {
        Some(1) => {
            let body = files::unframe(MAGIC, 1, bytes).map_err(corrupt)?;
            let v1: legacy::SnapshotBodyV1 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v1.into());
        }
        Some(2) => {
            let body = files::unframe(MAGIC, 2, bytes).map_err(corrupt)?;
            let v2: legacy::SnapshotBodyV2 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v2.into());
        }
        Some(3) => {
            let body = files::unframe(MAGIC, 3, bytes).map_err(corrupt)?;
            let v3: legacy::SnapshotBodyV3 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v3.into());
        }
        Some(4) => {
            let body = files::unframe(MAGIC, 4, bytes).map_err(corrupt)?;
            let v4: legacy::SnapshotBodyV4 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v4.into());
        }
        Some(5) => {
            let body = files::unframe(MAGIC, 5, bytes).map_err(corrupt)?;
            let v5: legacy::SnapshotBodyV5 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v5.into());
        }
        Some(6) => {
            let body = files::unframe(MAGIC, 6, bytes).map_err(corrupt)?;
            let v6: legacy::SnapshotBodyV6 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v6.into());
        }
        _ => {}
    }
    let body = files::unframe(MAGIC, FORMAT_VERSION, bytes).map_err(corrupt)?;
    codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))
}

impl<S: Into<Space>> From<legacy::OldBody<S>> for SnapshotBody {
    fn from(old: legacy::OldBody<S>) -> Self {
        SnapshotBody {
            meta: old.meta,
            state: CoordState::from(old.state.into()),
        }
    }
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

    /// The base state of a restored replica (see [`super::backup`]), if there is one.
    pub(crate) fn load_base(&self) -> Result<Option<SnapshotBody>, SnapshotError> {
        let path = self.dir.join(BASE_FILE);
        match files::read_if_exists(&path).map_err(|source| SnapshotError::Io {
            path: path.clone(),
            source,
        })? {
            None => Ok(None),
            Some(bytes) => decode(&bytes, &path.display().to_string()).map(Some),
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
mod tests;

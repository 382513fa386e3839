//! An independent witness of what the Raft log must contain, kept beside it.
//!
//! The log reads a damaged newest segment as a torn write and carries on from the last whole
//! record, and a lost or scribbled-over segment file leaves a shorter (even empty) log: a replica
//! would come back with older data and, worse, a forgotten vote, and could vote twice in one term.
//! So the vote and a lower bound of the committed index are also kept in `witness.bin`, a small
//! checksummed file replaced atomically. When the storage opens, the log must agree with it: a vote older than
//! the witnessed one, or a log that ends before the witnessed commit index, means the data is
//! damaged and the replica must not run on it.
//!
//! The vote is written here on every vote change (rare, and already a synchronous write). The
//! committed index is advanced after a log sync at most once a [`COMMIT_WITNESS_INTERVAL`], and
//! never past what that sync made durable, so keeping it costs one small write per interval.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::types::Vote;

use super::files;

const MAGIC: &[u8; 8] = b"COORDWIT";
const FORMAT_VERSION: u32 = 1;
pub(crate) const FILE_NAME: &str = "witness.bin";
/// How often, at most, the committed index is written down.
pub const COMMIT_WITNESS_INTERVAL: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct WitnessState {
    pub vote: Option<Vote>,
    /// Every entry up to this index was committed and durable in this replica's log.
    pub committed_index: u64,
}

pub(crate) struct Witness {
    dir: PathBuf,
    state: Mutex<(WitnessState, Option<Instant>)>,
}

impl Witness {
    /// Opens the witness in `dir`; also returns what it held (`None` on a replica's first start).
    pub(crate) fn open(dir: &Path) -> Result<(Self, Option<WitnessState>), String> {
        let path = dir.join(FILE_NAME);
        let stored =
            match files::read_if_exists(&path).map_err(|e| format!("{}: {e}", path.display()))? {
                None => None,
                Some(bytes) => {
                    let body = files::unframe(MAGIC, FORMAT_VERSION, &bytes)
                        .map_err(|e| format!("{} is corrupt: {e}", path.display()))?;
                    Some(
                        codec::decode::<WitnessState>("witness", body)
                            .map_err(|e| format!("{} is corrupt: {e}", path.display()))?,
                    )
                }
            };
        let witness = Self {
            dir: dir.to_path_buf(),
            state: Mutex::new((stored.clone().unwrap_or_default(), None)),
        };
        Ok((witness, stored))
    }

    fn write(&self, state: &WitnessState) -> std::io::Result<()> {
        let body = codec::encode("witness", state).map_err(std::io::Error::other)?;
        files::write_atomically(
            &self.dir,
            FILE_NAME,
            &files::frame(MAGIC, FORMAT_VERSION, &body),
        )
    }

    /// Durably writes the empty state of a new log.
    pub(crate) fn write_initial(&self) -> std::io::Result<()> {
        self.write(&WitnessState::default())
    }

    /// Durably records a new vote.
    pub(crate) fn record_vote(&self, vote: &Vote) -> std::io::Result<()> {
        let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = g.0.clone();
        next.vote = Some(*vote);
        self.write(&next)?;
        g.0 = next;
        Ok(())
    }

    /// Raises the committed index to `index` if it grew and the last write is old enough.
    pub(crate) fn advance_committed(&self, index: u64) -> std::io::Result<()> {
        let mut g = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if index <= g.0.committed_index
            || g.1.is_some_and(|t| t.elapsed() < COMMIT_WITNESS_INTERVAL)
        {
            return Ok(());
        }
        let mut next = g.0.clone();
        next.committed_index = index;
        self.write(&next)?;
        *g = (next, Some(Instant::now()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_reopen_and_refuses_damage() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (w, stored) = Witness::open(dir.path()).expect("open");
        assert_eq!(stored, None);
        w.record_vote(&Vote::new(3, 1)).expect("vote");
        w.advance_committed(10).expect("commit");
        w.advance_committed(20).expect("rate-limited, not written");
        drop(w);
        let (_, stored) = Witness::open(dir.path()).expect("reopen");
        assert_eq!(
            stored,
            Some(WitnessState {
                vote: Some(Vote::new(3, 1)),
                committed_index: 10
            })
        );
        let path = dir.path().join(FILE_NAME);
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).expect("damage");
        assert!(Witness::open(dir.path()).is_err());
    }
}

//! One replica process per data directory.
//!
//! Two `coordinator` processes started on the same `--data-dir` (a second systemd unit, a copied
//! command line, a container restarted while the old one still runs) would both append to the
//! same Raft log and both answer as the same replica: the log and the ensemble's safety are lost.
//! So a replica takes an exclusive lock on `<data-dir>/LOCK` before it opens anything there, and
//! holds it for its life (the kernel drops it when the process ends, however it ends). The file
//! names the holder, so the refused process can say who has the directory.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = "LOCK";

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot create data directory {dir}: {source}")]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot lock data directory {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("data directory {dir} is in use by another coordinator ({holder}); one replica process per data directory")]
    Held { dir: PathBuf, holder: String },
}

/// The lock on a data directory, held while this value lives.
#[derive(Debug)]
pub struct DataLock {
    _file: File,
}

impl DataLock {
    /// Takes the lock on `dir` (created if needed), or says who holds it.
    pub fn take(dir: &Path) -> Result<Self, LockError> {
        let io = |source| LockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|source| LockError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(LOCK_FILE))
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder: if holder.is_empty() {
                        "a process that has not written its name yet".into()
                    } else {
                        holder.to_string()
                    },
                });
            }
            Err(TryLockError::Error(e)) => return Err(io(e)),
        }
        let me = format!(
            "pid {} on {}",
            std::process::id(),
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_else(|_| "this host".into())
        );
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{me}\n").as_bytes()))
            .and_then(|()| file.sync_data())
            .map_err(io)?;
        Ok(Self { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = DataLock::take(dir.path()).expect("first lock");
        match DataLock::take(dir.path()) {
            Err(LockError::Held { holder, .. }) => {
                assert!(
                    holder.contains(&format!("pid {}", std::process::id())),
                    "{holder}"
                )
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        DataLock::take(dir.path()).expect("free again once dropped");
    }
}

//! How much Raft log a phase of a benchmark wrote: the leader's entries, the bytes of their
//! records in the segment files, and its data directory's growth.

use std::path::Path;

use super::DiskUsage;

/// The leader's Raft log at one moment.
#[derive(Clone, Copy, Debug)]
pub(super) struct LogMark {
    pub last_index: u64,
    pub snapshot_index: u64,
    /// Bytes of log records in the segment files (see [`log_record_bytes`]).
    pub records: u64,
    /// The whole data directory.
    pub disk: DiskUsage,
}

/// What the log gained between two marks. Signed: a snapshot may purge log files meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct LogGrowth {
    pub entries: u64,
    /// Bytes of log records.
    pub records: i64,
    pub on_disk: i64,
    pub apparent: i64,
    pub snapshotted: bool,
}

impl LogMark {
    pub fn to(self, later: LogMark) -> LogGrowth {
        let delta = |a: u64, b: u64| b as i64 - a as i64;
        LogGrowth {
            entries: later.last_index.saturating_sub(self.last_index),
            records: delta(self.records, later.records),
            on_disk: delta(self.disk.on_disk, later.disk.on_disk),
            apparent: delta(self.disk.apparent, later.disk.apparent),
            snapshotted: later.snapshot_index != self.snapshot_index,
        }
    }
}

/// Bytes of Raft log records in the segment files (`*.seg`) under `dir`. A segment is filled with
/// zeros before records are written over them (raft-store's `storage::segments`), so the
/// directory's size moves in 4 MiB steps; the records (a u32 LE body length, a CRC, the body)
/// end at the first zero length.
pub(super) fn log_record_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::FileExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            total += log_record_bytes(&path);
            continue;
        }
        if path.extension().is_none_or(|x| x != "seg") {
            continue;
        }
        let Ok(file) = std::fs::File::open(&path) else {
            continue;
        };
        let len = file.metadata().map_or(0, |m| m.len());
        let mut at = 0;
        let mut header = [0u8; 8];
        while at + 8 <= len && file.read_exact_at(&mut header, at).is_ok() {
            let body = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
            if body == 0 {
                break;
            }
            at = (at + 8 + u64::from(body)).min(len);
        }
        total += at;
    }
    total
}

/// A phase's log: the bytes of log records it added (per call of the phase too, when it had
/// `calls`), the entries they came in (each a batch of commands), and the leader's data
/// directory's growth (allocated and apparent).
pub(super) fn log_cell(g: &LogGrowth, calls: Option<usize>) -> String {
    let per_call = match calls {
        Some(n) if n > 0 => format!(" ({:.1} KB/call)", g.records as f64 / n as f64 / 1e3),
        _ => String::new(),
    };
    let snapshot = ["", ", snapshot taken"][usize::from(g.snapshotted)];
    format!(
        "{:+.1} MB of records{per_call} in {} entries; data dir {:+.1} MB on disk, {:+.1} MB apparent{snapshot}",
        g.records as f64 / 1e6,
        g.entries,
        g.on_disk as f64 / 1e6,
        g.apparent as f64 / 1e6
    )
}

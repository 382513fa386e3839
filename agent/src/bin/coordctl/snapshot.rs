//! `coordctl snapshot`: every replica compacts its log now; `coordctl snapshot save FILE`: a
//! backup of the whole state from the leader, written durably and checked, for
//! `coordinator --restore FILE`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;
use coord_agent::CoordClient;
use serde_json::{json, Value};
use tonic::Status;

use super::output::{Output, Table};

#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// A backup of the whole replicated state (keys, tasks, barriers, both dispatchers), taken by
    /// the leader at a linearizable point: every write acknowledged before it is in it. Written to
    /// FILE.part, synced, checked, then renamed to FILE.
    Save {
        /// Where to write the backup.
        file: String,
    },
}

pub async fn run(
    client: &CoordClient,
    endpoints: &[String],
    cmd: Option<SnapshotCmd>,
    out: Output,
) -> Result<ExitCode, Status> {
    match cmd {
        None => compact(client, endpoints, out).await,
        Some(SnapshotCmd::Save { file }) => save(client, &file, out).await,
    }
}

async fn compact(
    client: &CoordClient,
    endpoints: &[String],
    out: Output,
) -> Result<ExitCode, Status> {
    let mut t = Table::new(&["ENDPOINT", "SNAPSHOT INDEX", "ERROR"]);
    let mut failed = 0;
    for (i, ep) in endpoints.iter().enumerate() {
        match client.snapshot_of(i).await {
            Ok(index) => t.push(vec![json!(ep), json!(index), Value::Null]),
            Err(e) => {
                failed += 1;
                t.push(vec![json!(ep), Value::Null, json!(e.message())]);
            }
        }
    }
    t.print(out);
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn save(client: &CoordClient, file: &str, out: Output) -> Result<ExitCode, Status> {
    let (about, bytes) = client.backup().await?;
    let crc = check(&bytes)
        .map_err(|e| Status::data_loss(format!("the backup received is damaged: {e}")))?;
    write_durably(Path::new(file), &bytes)
        .map_err(|e| Status::failed_precondition(format!("cannot write {file}: {e}")))?;
    let mut t = Table::new(&[
        "FILE",
        "BYTES",
        "CRC32",
        "BACKUP ID",
        "KEYS",
        "REVISION",
        "APPLIED INDEX",
    ]);
    t.push(vec![
        json!(file),
        json!(bytes.len()),
        json!(format!("{crc:08x}")),
        json!(format!("{:016x}", about.backup_id)),
        json!(about.keys),
        json!(about.revision),
        json!(about.applied_index),
    ]);
    t.print(out);
    Ok(ExitCode::SUCCESS)
}

/// Checks a backup file's frame (magic, length, CRC-32 of the body, as
/// `coord_raft_store::storage::files` writes it); returns the CRC.
fn check(bytes: &[u8]) -> Result<u32, String> {
    const HEADER: usize = 8 + 4 + 4 + 8;
    if bytes.len() < HEADER || &bytes[..8] != b"COORDBAK" {
        return Err("not a coord backup".into());
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let mut len = [0u8; 8];
    len.copy_from_slice(&bytes[16..24]);
    let body = &bytes[HEADER..];
    if u64::from_le_bytes(len) != body.len() as u64 {
        return Err("truncated".into());
    }
    let crc = crc32fast::hash(body);
    if crc != word(12) {
        return Err("checksum mismatch".into());
    }
    Ok(crc)
}

/// Writes `bytes` to `path.part`, syncs it, renames it to `path` and syncs the directory.
fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut part = path.as_os_str().to_owned();
    part.push(".part");
    let part = std::path::PathBuf::from(part);
    let mut f = std::fs::File::create(&part)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&part, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

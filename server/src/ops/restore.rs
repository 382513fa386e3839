//! `coordinator --restore FILE`: a new ensemble from a backup (`coordctl snapshot save FILE`).
//!
//! Every replica of the new ensemble is started once with the same `--restore FILE` on an empty
//! data directory (as is a replica that joins it later). The backup is checked (its checksum, and
//! that the state inside decodes), its state is written as the replica's base (see
//! `coord_raft_store::storage::backup`), and the replica's identity records the backup's id, from
//! which its cluster id is derived: the new ensemble never mixes with the old one. Later starts
//! need no `--restore`; given again with the same file it is a no-op, with another it is refused.

use std::path::Path;

use coord_raft_store::storage::backup::Backup;

use crate::ops::config::Args;
use crate::ops::identity;

/// Prepares the data directory from the backup at `path`; returns the backup's id.
pub fn prepare(args: &Args, path: &Path) -> Result<u64, String> {
    let shown = path.display();
    let bytes =
        std::fs::read(path).map_err(|e| format!("--restore {shown}: cannot read it: {e}"))?;
    let (backup, state) = Backup::decode(&bytes, &shown.to_string())
        .map_err(|e| format!("--restore {shown}: {e}"))?;
    let already = identity::recorded_restore(args).map_err(|e| e.to_string())?;
    match already {
        Some(id) if id == backup.id => {
            tracing::info!(backup = format!("{id:016x}"), "already restored from this backup; --restore does nothing");
            return Ok(id);
        }
        Some(id) => {
            return Err(format!(
                "--restore {shown}: data directory {} was restored from another backup ({id:016x}, this one is {:016x}); restore into an empty data directory",
                args.data_dir.display(),
                backup.id
            ))
        }
        None if identity::recorded(args).map_err(|e| e.to_string())? || holds_raft_state(&args.data_dir) => {
            return Err(format!(
                "--restore {shown}: data directory {} already holds a replica; restore into an empty data directory",
                args.data_dir.display()
            ))
        }
        None => {}
    }
    backup
        .write_base(&args.data_dir)
        .map_err(|e| format!("--restore {shown}: {e}"))?;
    tracing::info!(
        backup = format!("{:016x}", backup.id),
        source_cluster = format!("{:016x}", backup.source_cluster_id),
        source_applied_index = backup.applied_index,
        keys = state.kv.len(),
        "restoring a new ensemble from a backup"
    );
    Ok(backup.id)
}

/// Whether the data directory already has Raft log segments or a snapshot.
fn holds_raft_state(data_dir: &Path) -> bool {
    let nonempty = |d: &Path| std::fs::read_dir(d).is_ok_and(|mut e| e.next().is_some());
    nonempty(&data_dir.join("raft"))
        || data_dir
            .join(coord_raft_store::storage::SNAPSHOT_DIR)
            .join("snapshot.bin")
            .exists()
}

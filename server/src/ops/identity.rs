//! Which ensemble and which replica a data directory belongs to.
//!
//! The first start of a replica records its identity in `identity.json` in the data directory.
//! Every later start checks the flags against it and refuses to run on a directory of another
//! replica or another ensemble, or with an `--initial-cluster` that differs from the one the
//! replica was created with: any of these would let a replica vote with somebody else's log. A
//! recorded identity whose Raft state has vanished is refused too: that replica has forgotten its
//! votes.
//!
//! A replica of an ensemble restored from a backup (`--restore`) records the backup's id, and its
//! cluster id is derived from it as well: the restored ensemble and the one the backup came from
//! (or another restored from a different backup) never take each other's Raft traffic, even on
//! the same addresses with the same `--cluster-token`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use coord_raft_store::storage::files;

use crate::ops::config::{Args, InitialCluster};

const IDENTITY_FILE: &str = "identity.json";

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct ReplicaIdentity {
    pub cluster_id: u64,
    pub replica_id: u64,
    pub initial_cluster: InitialCluster,
    /// The id of the backup this replica's ensemble was restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<u64>,
}

/// The cluster id of the ensemble the flags describe, restored from backup `restored_from`.
pub fn cluster_id(args: &Args, restored_from: Option<u64>) -> u64 {
    let base = args.initial_cluster.cluster_id(&args.cluster_token);
    match restored_from {
        None => base,
        // Any bijective mix will do: the backup id is random.
        Some(backup) => (base ^ backup.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
    }
}

/// The backup the replica in `args.data_dir` was restored from, as its identity records it.
pub fn recorded_restore(args: &Args) -> Result<Option<u64>, IdentityError> {
    Ok(read(&args.data_dir)?.and_then(|i| i.restored_from))
}

/// Whether the data directory has an identity yet.
pub fn recorded(args: &Args) -> Result<bool, IdentityError> {
    Ok(read(&args.data_dir)?.is_some())
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("data directory {dir} belongs to replica {stored}, not to replica {given} (--id)")]
    OtherReplica {
        dir: String,
        stored: u64,
        given: u64,
    },
    #[error("data directory {dir} belongs to another ensemble (cluster id {stored:016x}, initial cluster {stored_cluster}); this replica was started for cluster id {given:016x} (check --cluster-token and --initial-cluster)")]
    OtherCluster {
        dir: String,
        stored: u64,
        stored_cluster: InitialCluster,
        given: u64,
    },
    #[error("--initial-cluster {given} disagrees with the membership this replica was created with ({stored}); restart it with the original flags")]
    MembershipMismatch {
        stored: InitialCluster,
        given: InitialCluster,
    },
    #[error("data directory {dir} holds a Raft log but no replica identity ({IDENTITY_FILE}): it was not created by this coordinator, or it is damaged")]
    Unidentified { dir: String },
    #[error("data directory {dir} belongs to a replica ({IDENTITY_FILE}) but its Raft state (raft/) is gone: the replica would forget its votes; remove it from the ensemble and add it back with an empty data directory")]
    RaftStateLost { dir: String },
    #[error("cannot read or write {path}: {reason}")]
    File { path: String, reason: String },
}

/// What the storage said about the Raft state it opened.
pub struct RaftState {
    /// The Raft directory was created just now.
    pub fresh: bool,
    /// No vote and no log entry yet.
    pub pristine: bool,
}

/// Checks the data directory against the flags (and the backup it was restored from), recording
/// the identity on the first start.
pub fn check_or_record(
    args: &Args,
    raft: &RaftState,
    restored_from: Option<u64>,
) -> Result<(), IdentityError> {
    let dir = args.data_dir.display().to_string();
    let given = ReplicaIdentity {
        cluster_id: cluster_id(args, restored_from),
        replica_id: args.id,
        initial_cluster: args.initial_cluster.clone(),
        restored_from,
    };
    match read(&args.data_dir)? {
        // A first start (or one that crashed before recording the identity).
        None if raft.pristine => write(&args.data_dir, &given),
        None => Err(IdentityError::Unidentified { dir }),
        Some(_) if raft.fresh => Err(IdentityError::RaftStateLost { dir }),
        Some(stored) => compare(&dir, &stored, &given),
    }
}

fn read(dir: &Path) -> Result<Option<ReplicaIdentity>, IdentityError> {
    let path = dir.join(IDENTITY_FILE);
    let file_err = |reason: String| IdentityError::File {
        path: path.display().to_string(),
        reason,
    };
    match files::read_if_exists(&path).map_err(|e| file_err(e.to_string()))? {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| file_err(format!("not a replica identity: {e}"))),
    }
}

fn write(dir: &Path, identity: &ReplicaIdentity) -> Result<(), IdentityError> {
    let file_err = |reason: String| IdentityError::File {
        path: dir.join(IDENTITY_FILE).display().to_string(),
        reason,
    };
    let bytes = serde_json::to_vec_pretty(identity).map_err(|e| file_err(e.to_string()))?;
    files::write_atomically(dir, IDENTITY_FILE, &bytes).map_err(|e| file_err(e.to_string()))
}

fn compare(
    dir: &str,
    stored: &ReplicaIdentity,
    given: &ReplicaIdentity,
) -> Result<(), IdentityError> {
    if stored.replica_id != given.replica_id {
        return Err(IdentityError::OtherReplica {
            dir: dir.to_string(),
            stored: stored.replica_id,
            given: given.replica_id,
        });
    }
    if stored.initial_cluster != given.initial_cluster {
        return Err(IdentityError::MembershipMismatch {
            stored: stored.initial_cluster.clone(),
            given: given.initial_cluster.clone(),
        });
    }
    if stored.cluster_id != given.cluster_id {
        return Err(IdentityError::OtherCluster {
            dir: dir.to_string(),
            stored: stored.cluster_id,
            stored_cluster: stored.initial_cluster.clone(),
            given: given.cluster_id,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ident(replica: u64, token: &str, members: &[(u64, &str)]) -> ReplicaIdentity {
        let c = InitialCluster(
            members
                .iter()
                .map(|(i, a)| (*i, a.to_string()))
                .collect::<BTreeMap<_, _>>(),
        );
        ReplicaIdentity {
            cluster_id: c.cluster_id(token),
            replica_id: replica,
            initial_cluster: c,
            restored_from: None,
        }
    }

    #[test]
    fn detects_each_mismatch() {
        let m = [(1, "h:1"), (2, "h:2")];
        let base = ident(1, "t", &m);
        assert!(compare("d", &base, &ident(1, "t", &m)).is_ok());
        assert!(matches!(
            compare("d", &base, &ident(2, "t", &m)),
            Err(IdentityError::OtherReplica {
                stored: 1,
                given: 2,
                ..
            })
        ));
        assert!(matches!(
            compare("d", &base, &ident(1, "other", &m)),
            Err(IdentityError::OtherCluster { .. })
        ));
        assert!(matches!(
            compare("d", &base, &ident(1, "t", &[(1, "h:1"), (2, "h:9")])),
            Err(IdentityError::MembershipMismatch { .. })
        ));
    }

    #[test]
    fn a_restored_ensemble_has_a_cluster_id_of_its_own() {
        use clap::Parser;
        let args = Args::parse_from([
            "coordinator",
            "--id",
            "1",
            "--initial-cluster",
            "1=h:1,2=h:2,3=h:3",
            "--data-dir",
            "/nonexistent",
            "--listen",
            "127.0.0.1:1",
            "--http-listen",
            "127.0.0.1:2",
        ]);
        let plain = cluster_id(&args, None);
        assert_eq!(plain, args.initial_cluster.cluster_id(&args.cluster_token));
        let (a, b) = (cluster_id(&args, Some(1)), cluster_id(&args, Some(2)));
        assert!(plain != a && plain != b && a != b, "{plain:x} {a:x} {b:x}");
        assert_eq!(a, cluster_id(&args, Some(1)));
    }
}

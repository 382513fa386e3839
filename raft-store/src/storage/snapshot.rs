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
//! 6 made the two dispatchers one and gave the store its raw key space (torch's keys); older
//! snapshots still read (as run 0, with no recoverable task, with an empty tf.data dispatcher,
//! with no quota until the leader sets one, with their dispatchers converted by
//! `dispatcher::legacy::convert`, with no raw key).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::state::{Cluster, CoordState};
use crate::types::SnapshotMeta;

use super::files;
use crate::dispatcher::legacy::{self, coord::DispatcherState as LegacyDispatcher};

/// TensorFlow's dispatcher as formats 4 and 5 hold it.
type LegacyTfData = legacy::tf::TfDataState;

mod v5;

const MAGIC: &[u8; 8] = b"COORDSNP";
const FORMAT_VERSION: u32 = 6;
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
    match files::version_of(bytes) {
        Some(1) => {
            let body = files::unframe(MAGIC, 1, bytes).map_err(corrupt)?;
            let v1: SnapshotBodyV1 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v1.into());
        }
        Some(2) => {
            let body = files::unframe(MAGIC, 2, bytes).map_err(corrupt)?;
            let v2: SnapshotBodyV2 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v2.into());
        }
        Some(3) => {
            let body = files::unframe(MAGIC, 3, bytes).map_err(corrupt)?;
            let v3: SnapshotBodyV3 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v3.into());
        }
        Some(4) => {
            let body = files::unframe(MAGIC, 4, bytes).map_err(corrupt)?;
            let v4: SnapshotBodyV4 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v4.into());
        }
        Some(5) => {
            let body = files::unframe(MAGIC, 5, bytes).map_err(corrupt)?;
            let v5: v5::SnapshotBodyV5 =
                codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))?;
            return Ok(v5.into());
        }
        _ => {}
    }
    let body = files::unframe(MAGIC, FORMAT_VERSION, bytes).map_err(corrupt)?;
    codec::decode("snapshot", body).map_err(|e| corrupt(e.to_string()))
}

/// The cluster of formats 1 and 2: without per-task recoverability.
#[derive(Deserialize)]
struct ClusterV2 {
    config: crate::state::ClusterConfig,
    service_incarnation: u64,
    tasks: crate::state::TaskRegistry,
    barriers: crate::state::Barriers,
    errors: crate::state::ErrorFeed,
    alive: crate::state::AliveQueries,
    task_version: u64,
}

impl From<ClusterV2> for Cluster {
    fn from(c: ClusterV2) -> Self {
        Cluster {
            config: c.config,
            service_incarnation: c.service_incarnation,
            tasks: c.tasks,
            barriers: c.barriers,
            errors: c.errors,
            alive: c.alive,
            task_version: c.task_version,
            recoverable_tasks: Default::default(),
        }
    }
}

/// A snapshot of format 1: the state without its runs.
#[derive(Deserialize)]
struct SnapshotBodyV1 {
    meta: SnapshotMeta,
    state: StateV1,
}

#[derive(Deserialize)]
struct StateV1 {
    kv: crate::state::KvStoreBeforeRaw,
    sessions: crate::state::SessionTable,
    cluster: Option<ClusterV2>,
    dispatcher: LegacyDispatcher,
}

impl From<SnapshotBodyV1> for SnapshotBody {
    fn from(v1: SnapshotBodyV1) -> Self {
        let StateV1 {
            kv,
            sessions,
            cluster,
            dispatcher,
        } = v1.state;
        SnapshotBody {
            meta: v1.meta,
            state: CoordState {
                kv: kv.into(),
                sessions,
                cluster: cluster.map(Cluster::from),
                dispatcher: legacy::convert(dispatcher, Default::default()),
                runs: Default::default(),
                quota: Default::default(),
            },
        }
    }
}

/// A snapshot of format 2: runs, but no per-task recoverability.
#[derive(Deserialize)]
struct SnapshotBodyV2 {
    meta: SnapshotMeta,
    state: StateV2,
}

#[derive(Deserialize)]
struct StateV2 {
    kv: crate::state::KvStoreBeforeRaw,
    sessions: crate::state::SessionTable,
    cluster: Option<ClusterV2>,
    dispatcher: LegacyDispatcher,
    runs: crate::state::JobRuns,
}

impl From<SnapshotBodyV2> for SnapshotBody {
    fn from(v2: SnapshotBodyV2) -> Self {
        let StateV2 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
        } = v2.state;
        SnapshotBody {
            meta: v2.meta,
            state: CoordState {
                kv: kv.into(),
                sessions,
                cluster: cluster.map(Cluster::from),
                dispatcher: legacy::convert(dispatcher, Default::default()),
                runs,
                quota: Default::default(),
            },
        }
    }
}

/// A snapshot of format 3: no tf.data dispatcher of TensorFlow's.
#[derive(Deserialize)]
struct SnapshotBodyV3 {
    meta: SnapshotMeta,
    state: StateV3,
}

#[derive(Deserialize)]
struct StateV3 {
    kv: crate::state::KvStoreBeforeRaw,
    sessions: crate::state::SessionTable,
    cluster: Option<Cluster>,
    dispatcher: LegacyDispatcher,
    runs: crate::state::JobRuns,
}

impl From<SnapshotBodyV3> for SnapshotBody {
    fn from(v3: SnapshotBodyV3) -> Self {
        let StateV3 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
        } = v3.state;
        SnapshotBody {
            meta: v3.meta,
            state: CoordState {
                kv: kv.into(),
                sessions,
                cluster,
                dispatcher: legacy::convert(dispatcher, Default::default()),
                runs,
                quota: Default::default(),
            },
        }
    }
}

/// A snapshot of format 4: no memory quota.
#[derive(Deserialize)]
struct SnapshotBodyV4 {
    meta: SnapshotMeta,
    state: StateV4,
}

#[derive(Deserialize)]
struct StateV4 {
    kv: crate::state::KvStoreBeforeRaw,
    sessions: crate::state::SessionTable,
    cluster: Option<Cluster>,
    dispatcher: LegacyDispatcher,
    runs: crate::state::JobRuns,
    tfdata: LegacyTfData,
}

impl From<SnapshotBodyV4> for SnapshotBody {
    fn from(v4: SnapshotBodyV4) -> Self {
        let StateV4 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
            tfdata,
        } = v4.state;
        SnapshotBody {
            meta: v4.meta,
            state: CoordState {
                kv: kv.into(),
                sessions,
                cluster,
                dispatcher: legacy::convert(dispatcher, tfdata),
                runs,
                quota: Default::default(),
            },
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
        let path = self.dir.join(super::backup::BASE_FILE);
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
mod tests {
    use super::*;
    use crate::types::StoredMembership;

    /// Applies `ops` to `b`'s state, one proposal each.
    fn applied(b: &mut SnapshotBody, ops: Vec<crate::command::Op>) {
        use crate::command::{Command, Proposal};
        let mut changes = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            let c = Command { request: None, op };
            b.state
                .apply(&Proposal::new(i as u64 + 1, vec![c]), &mut changes);
        }
    }

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

    /// A snapshot written before runs existed (format 1) still reads, with its state intact.
    #[test]
    fn a_format_1_snapshot_reads_as_run_0() {
        #[derive(Serialize)]
        struct V1<'a> {
            meta: &'a SnapshotMeta,
            kv: &'a crate::state::KvStoreBeforeRaw,
            sessions: &'a crate::state::SessionTable,
            cluster: &'a Option<crate::state::Cluster>,
            dispatcher: &'a LegacyDispatcher,
        }
        let mut b = body();
        let mut changes = Vec::new();
        let put = crate::command::Command {
            request: None,
            op: crate::command::Op::KvPut {
                key: "k".into(),
                value: bytes::Bytes::from("v"),
                overwrite: false,
            },
        };
        b.state
            .apply(&crate::command::Proposal::new(1, vec![put]), &mut changes);
        let s = &b.state;
        let v1 = codec::encode(
            "snapshot",
            &V1 {
                meta: &b.meta,
                kv: &s.kv.to_before_raw(),
                sessions: &s.sessions,
                cluster: &s.cluster,
                dispatcher: &LegacyDispatcher::default(),
            },
        )
        .expect("encode");
        let read = decode(&files::frame(MAGIC, 1, &v1), "v1").expect("a format-1 snapshot reads");
        assert_eq!(read.state, without_quota(&b.state));
        assert_eq!(read.state.runs.number, 0);
    }

    /// A snapshot written before per-task recoverability (format 2), with a job's cluster and a
    /// registered task in it, still reads, with no task recoverable.
    #[test]
    fn a_format_2_snapshot_reads_with_no_recoverable_task() {
        use crate::command::Op;
        use crate::state::{
            AliveQueries, Barriers, ClusterConfig, ErrorFeed, JobRuns, TaskName, TaskRegistry,
        };
        #[derive(Serialize)]
        struct ClusterV2<'a> {
            config: &'a ClusterConfig,
            service_incarnation: u64,
            tasks: &'a TaskRegistry,
            barriers: &'a Barriers,
            errors: &'a ErrorFeed,
            alive: &'a AliveQueries,
            task_version: u64,
        }
        #[derive(Serialize)]
        struct V2<'a> {
            meta: &'a SnapshotMeta,
            kv: &'a crate::state::KvStoreBeforeRaw,
            sessions: &'a crate::state::SessionTable,
            cluster: Option<ClusterV2<'a>>,
            dispatcher: &'a LegacyDispatcher,
            runs: &'a JobRuns,
        }
        let mut b = body();
        let ops = vec![
            Op::InitCluster {
                config: ClusterConfig {
                    jobs: [("w".to_string(), 2)].into_iter().collect(),
                    ..ClusterConfig::default()
                },
                service_incarnation: 3,
            },
            Op::RegisterTask {
                task: TaskName::new("w", 0),
                incarnation: 7,
            },
        ];
        applied(&mut b, ops);
        let s = &b.state;
        let c = s.cluster.as_ref().expect("a cluster");
        let v2 = codec::encode(
            "snapshot",
            &V2 {
                meta: &b.meta,
                kv: &s.kv.to_before_raw(),
                sessions: &s.sessions,
                cluster: Some(ClusterV2 {
                    config: &c.config,
                    service_incarnation: c.service_incarnation,
                    tasks: &c.tasks,
                    barriers: &c.barriers,
                    errors: &c.errors,
                    alive: &c.alive,
                    task_version: c.task_version,
                }),
                dispatcher: &LegacyDispatcher::default(),
                runs: &s.runs,
            },
        )
        .expect("encode");
        let read = decode(&files::frame(MAGIC, 2, &v2), "v2").expect("a format-2 snapshot reads");
        assert_eq!(read.state, without_quota(&b.state));
        let cluster = read.state.cluster.expect("the cluster");
        assert!(cluster.recoverable_tasks.is_empty());
        assert_eq!(
            cluster
                .tasks
                .get(&TaskName::new("w", 0))
                .map(|r| r.incarnation),
            Some(7)
        );
    }

    /// A snapshot written before TensorFlow's tf.data dispatcher existed (format 3), with a key
    /// and a cluster in it, still reads, with an empty dispatcher.
    /// What a snapshot from before the quota reads as: the state with no quota set.
    fn without_quota(state: &CoordState) -> CoordState {
        CoordState {
            quota: Default::default(),
            ..state.clone()
        }
    }

    /// A snapshot written before the memory quota (format 4) reads with no quota, and its store
    /// counts the same bytes as the store that wrote it.
    #[test]
    fn a_format_4_snapshot_reads_with_no_quota() {
        use crate::command::Op;
        #[derive(Serialize)]
        struct V4<'a> {
            meta: &'a SnapshotMeta,
            kv: &'a crate::state::KvStoreBeforeRaw,
            sessions: &'a crate::state::SessionTable,
            cluster: &'a Option<crate::state::Cluster>,
            dispatcher: &'a LegacyDispatcher,
            runs: &'a crate::state::JobRuns,
            tfdata: &'a LegacyTfData,
        }
        let mut b = body();
        let ops = (0..20)
            .map(|i| Op::KvPut {
                key: format!("k/{}", i % 7),
                value: bytes::Bytes::from(vec![b'v'; i * 10]),
                overwrite: true,
            })
            .chain([
                Op::KvDelete { key: "k/3".into() },
                Op::SetQuota { bytes: 1 << 20 },
            ])
            .collect();
        applied(&mut b, ops);
        let s = &b.state;
        assert_eq!(s.quota.bytes, 1 << 20);
        let v4 = codec::encode(
            "snapshot",
            &V4 {
                meta: &b.meta,
                kv: &s.kv.to_before_raw(),
                sessions: &s.sessions,
                cluster: &s.cluster,
                dispatcher: &LegacyDispatcher::default(),
                runs: &s.runs,
                tfdata: &LegacyTfData::default(),
            },
        )
        .expect("encode");
        let read = decode(&files::frame(MAGIC, 4, &v4), "v4").expect("a format-4 snapshot reads");
        assert_eq!(read.state, without_quota(&b.state));
        assert_eq!(read.state.kv.bytes(), b.state.kv.bytes());
        assert!(read.state.kv.bytes() > 0);
    }

    #[test]
    fn a_format_3_snapshot_reads_with_an_empty_tf_dispatcher() {
        use crate::command::Op;
        use crate::state::{ClusterConfig, JobRuns, TaskName};
        #[derive(Serialize)]
        struct V3<'a> {
            meta: &'a SnapshotMeta,
            kv: &'a crate::state::KvStoreBeforeRaw,
            sessions: &'a crate::state::SessionTable,
            cluster: &'a Option<crate::state::Cluster>,
            dispatcher: &'a LegacyDispatcher,
            runs: &'a JobRuns,
        }
        let mut b = body();
        let ops = vec![
            Op::InitCluster {
                config: ClusterConfig {
                    jobs: [("w".to_string(), 1)].into_iter().collect(),
                    ..ClusterConfig::default()
                },
                service_incarnation: 3,
            },
            Op::RegisterRecoverableTask {
                task: TaskName::new("w", 0),
                incarnation: 7,
            },
            Op::KvPut {
                key: "k".into(),
                value: bytes::Bytes::from("v"),
                overwrite: false,
            },
        ];
        applied(&mut b, ops);
        let s = &b.state;
        let v3 = codec::encode(
            "snapshot",
            &V3 {
                meta: &b.meta,
                kv: &s.kv.to_before_raw(),
                sessions: &s.sessions,
                cluster: &s.cluster,
                dispatcher: &LegacyDispatcher::default(),
                runs: &s.runs,
            },
        )
        .expect("encode");
        let read = decode(&files::frame(MAGIC, 3, &v3), "v3").expect("a format-3 snapshot reads");
        assert_eq!(read.state, without_quota(&b.state));
        assert_eq!(
            read.state.dispatcher,
            crate::dispatcher::DispatcherState::default()
        );
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

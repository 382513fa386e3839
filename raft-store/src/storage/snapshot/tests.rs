//! The snapshot file's promises, checked: a snapshot of every format ever written still reads,
//! as the state it held (each test writes one the way its format was written, field by field);
//! today's format round-trips; damage is refused, and no mutated body panics the decoder.

use super::*;
use crate::dispatcher::legacy::{
    coord::DispatcherState as LegacyDispatcher, tf::TfDataState as LegacyTfData,
};
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
    let cluster = read.state.default.cluster.expect("the cluster");
    assert!(cluster.recoverable_tasks.is_empty());
    assert_eq!(
        cluster
            .tasks
            .get(&TaskName::new("w", 0))
            .map(|r| r.incarnation),
        Some(7)
    );
}

/// What a snapshot from before the quota reads as: the state with no quota set.
fn without_quota(state: &CoordState) -> CoordState {
    let mut state = state.clone();
    state.quota = Default::default();
    state
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

/// A snapshot written before TensorFlow's tf.data dispatcher existed (format 3), with a key
/// and a cluster in it, still reads, with an empty dispatcher.
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

/// A snapshot written before the raw key space and with two dispatchers (format 5), with path
/// keys, a quota and sessions in it, reads with every part intact and no raw key.
#[test]
fn a_format_5_snapshot_reads_with_one_dispatcher_and_no_raw_keys() {
    use crate::command::Op;
    use crate::state::Cluster;
    #[derive(Serialize)]
    struct V5<'a> {
        meta: &'a SnapshotMeta,
        kv: &'a crate::state::KvStoreBeforeRaw,
        sessions: &'a crate::state::SessionTable,
        cluster: &'a Option<Cluster>,
        dispatcher: &'a LegacyDispatcher,
        runs: &'a crate::state::JobRuns,
        tfdata: &'a LegacyTfData,
        quota: &'a crate::state::Quota,
    }
    let mut b = body();
    let ops = (0..12)
        .map(|i| Op::KvPut {
            key: format!("k/{}", i % 5),
            value: bytes::Bytes::from(vec![b'v'; i * 3]),
            overwrite: true,
        })
        .chain([Op::SetQuota { bytes: 1 << 20 }])
        .collect();
    applied(&mut b, ops);
    let s = &b.state;
    let v5 = codec::encode(
        "snapshot",
        &V5 {
            meta: &b.meta,
            kv: &s.kv.to_before_raw(),
            sessions: &s.sessions,
            cluster: &s.cluster,
            dispatcher: &LegacyDispatcher::default(),
            runs: &s.runs,
            tfdata: &LegacyTfData::default(),
            quota: &s.quota,
        },
    )
    .expect("encode");
    let read = decode(&files::frame(MAGIC, 5, &v5), "v5").expect("a format-5 snapshot reads");
    assert_eq!(read.state, b.state);
    assert_eq!(read.state.kv.bytes(), b.state.kv.bytes());
    assert!(read.state.kv.raw().is_empty());
    assert_eq!(read.state.quota.bytes, 1 << 20);
}

/// Raw keys and queues survive the current format.
#[test]
fn raw_keys_round_trip_in_the_current_format() {
    use crate::command::Op;
    use crate::raw::RawOp;
    let mut b = body();
    let key = |s: &str| bytes::Bytes::from(s.to_string());
    applied(
        &mut b,
        vec![
            Op::Raw(RawOp::Set {
                entries: vec![(key("//a"), key("1")), (key("/a"), key("2"))],
            }),
            Op::Raw(RawOp::QueuePush {
                key: key("/q"),
                value: key("x"),
            }),
        ],
    );
    let read = decode(&encode(&b).expect("encode"), "v6").expect("reads");
    assert_eq!(read.state, b.state);
    assert_eq!(read.state.kv.raw().get(b"//a"), Some(&key("1")));
    assert_eq!(read.state.kv.raw().queue_len(b"/q"), 1);
    assert_eq!(read.state.kv.bytes(), b.state.kv.bytes());
}

/// A snapshot written before namespaces (format 6) reads as the default namespace, with no
/// named one; the default namespace's bytes are the same in both formats.
#[test]
fn a_format_6_snapshot_reads_as_the_default_namespace() {
    use crate::command::Op;
    let mut b = body();
    applied(
        &mut b,
        vec![Op::KvPut {
            key: "k".into(),
            value: bytes::Bytes::from("v"),
            overwrite: false,
        }],
    );
    #[derive(Serialize)]
    struct V6<'a> {
        meta: &'a SnapshotMeta,
        state: &'a crate::state::Space,
    }
    let v6 = codec::encode(
        "snapshot",
        &V6 {
            meta: &b.meta,
            state: &b.state.default,
        },
    )
    .expect("encode");
    let read = decode(&files::frame(MAGIC, 6, &v6), "v6").expect("reads");
    assert_eq!(read.state, b.state);
    assert!(read.state.namespaces.is_empty());
    let today = codec::encode("snapshot", &b).expect("encode");
    assert!(
        today.starts_with(&v6),
        "format 7 begins with format 6's bytes"
    );
}

/// Named namespaces, with their keys, jobs and limits, survive the current format.
#[test]
fn namespaces_round_trip_in_the_current_format() {
    use crate::command::Op;
    use crate::state::{ClusterConfig, NamespaceLimits};
    let mut b = body();
    let limits = NamespaceLimits {
        max_keys: 10,
        ..NamespaceLimits::default()
    };
    applied(
        &mut b,
        vec![
            Op::DeclareNamespace {
                namespace: "a".into(),
                config: ClusterConfig {
                    jobs: [("worker".to_string(), 2)].into_iter().collect(),
                    ..ClusterConfig::default()
                },
                limits,
                service_incarnation: 5,
            },
            Op::InNamespace {
                namespace: "a".into(),
                op: Box::new(Op::KvPut {
                    key: "k".into(),
                    value: bytes::Bytes::from("in a"),
                    overwrite: false,
                }),
            },
        ],
    );
    let read = decode(&encode(&b).expect("encode"), "v7").expect("reads");
    assert_eq!(read.state, b.state);
    let a = read.state.namespaces.get("a").expect("namespace a");
    assert_eq!(a.limits, limits);
    assert_eq!(
        a.space.kv.get("k").map(|e| e.value.clone()),
        Some(bytes::Bytes::from("in a"))
    );
    assert!(read.state.kv.get("k").is_none(), "the default has no k");
}

//! Snapshots of format 5: the state before the two dispatchers became one and before the store
//! had its raw key space (torch's keys). They read as one dispatcher
//! (`dispatcher::legacy::convert`) and a state whose raw key space is empty.

use serde::Deserialize;

use crate::state::{Cluster, CoordState};
use crate::types::SnapshotMeta;

use super::{LegacyDispatcher, LegacyTfData, SnapshotBody};
use crate::dispatcher::legacy;

#[derive(Deserialize)]
pub(super) struct SnapshotBodyV5 {
    meta: SnapshotMeta,
    state: StateV5,
}

#[derive(Deserialize)]
struct StateV5 {
    kv: crate::state::KvStoreBeforeRaw,
    sessions: crate::state::SessionTable,
    cluster: Option<Cluster>,
    dispatcher: LegacyDispatcher,
    runs: crate::state::JobRuns,
    tfdata: LegacyTfData,
    quota: crate::state::Quota,
}

impl From<SnapshotBodyV5> for SnapshotBody {
    fn from(v5: SnapshotBodyV5) -> Self {
        let StateV5 {
            kv,
            sessions,
            cluster,
            dispatcher,
            runs,
            tfdata,
            quota,
        } = v5.state;
        SnapshotBody {
            meta: v5.meta,
            state: CoordState {
                kv: kv.into(),
                sessions,
                cluster,
                dispatcher: legacy::convert(dispatcher, tfdata),
                runs,
                quota,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::Serialize;

    use super::super::{decode, encode, files, LegacyDispatcher, LegacyTfData, MAGIC};
    use super::*;
    use crate::codec;
    use crate::command::{Command, Op, Proposal};
    use crate::raw::RawOp;
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

    fn apply(b: &mut SnapshotBody, ops: Vec<Op>) {
        let mut changes = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            let c = Command { request: None, op };
            b.state
                .apply(&Proposal::new(i as u64 + 1, vec![c]), &mut changes);
        }
    }

    /// A snapshot written before the raw key space (format 5), with path keys, a quota and
    /// sessions in it, reads with every part intact and no raw key.
    #[test]
    fn a_format_5_snapshot_reads_with_no_raw_keys() {
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
        apply(&mut b, ops);
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
        let mut b = body();
        let key = |s: &str| bytes::Bytes::from(s.to_string());
        apply(
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
}

//! The quota on its own (its bound, its alarm, its re-measuring) and through the whole state's
//! `apply`. A file of its own because the second needs [`CoordState`], which sits above the quota.

use super::*;
use crate::state::CoordState;

#[test]
fn refuses_past_the_bound_and_clears_below_95_percent() {
    let mut q = Quota::default();
    assert!(
        q.refusal(10, u64::MAX, String::new).is_none(),
        "no quota set"
    );
    q.bytes = 1000;
    assert!(
        q.refusal(900, 100, String::new).is_none(),
        "exactly at the bound"
    );
    let refusal = q.refusal(900, 101, || "put of key \"k\"".into());
    let Some(OpError::Status { code, message }) = refusal else {
        panic!("not refused: {refusal:?}");
    };
    assert_eq!(code, Code::ResourceExhausted);
    assert!(
        message.contains("1000-byte quota (--quota-bytes)") && message.contains("\"k\""),
        "{message}"
    );
    q.alarm = true;
    q.settle(960);
    assert!(q.alarm, "still above 95%");
    q.settle(949);
    assert!(!q.alarm);
}

#[test]
fn records_are_remeasured_every_so_many_writes() {
    let mut q = Quota::default();
    for _ in 1..MEASURE_EVERY {
        assert!(!q.note_record_write(10));
    }
    assert!(q.note_record_write(10));
    assert_eq!(q.records_bytes, 10 * u64::from(MEASURE_EVERY));
    q.measured(77);
    assert_eq!(q.records_bytes, 77);
    assert!(!q.note_record_write(1));
}

#[test]
fn large_records_are_remeasured_after_proportionally_more_writes() {
    let mut q = Quota::default();
    // 30 MB of records (a 100,000-task job): measured after about 30,000 more writes, not 256.
    q.measured(30 << 20);
    let due = (30u64 << 20) / BYTES_PER_COMMAND;
    for n in 1..due {
        assert!(!q.note_record_write(0), "write {n}");
    }
    assert!(q.note_record_write(0));
}

/// Through `apply`: writes that grow are refused past the quota and change nothing but the
/// alarm; deletes, shrinking overwrites and reads go on; the alarm clears as usage falls.
#[test]
fn apply_refuses_growth_past_the_quota_and_nothing_else() {
    use bytes::Bytes;

    use crate::command::{Command, Op, Output, Proposal};

    let mut s = CoordState::default();
    let mut at = 0;
    let mut apply = |s: &mut CoordState, op: Op| {
        at += 1;
        let out = s.apply(
            &Proposal::new(at, vec![Command { request: None, op }]),
            &mut Vec::new(),
        );
        out.into_iter().next().expect("one result")
    };
    let put = |k: &str, n: usize| Op::KvPut {
        key: k.into(),
        value: Bytes::from(vec![b'x'; n]),
        overwrite: true,
    };
    assert_eq!(
        apply(&mut s, Op::SetQuota { bytes: 10_000 }),
        Ok(Output::Done)
    );
    let mut stored = 0;
    let refused = loop {
        match apply(&mut s, put(&format!("k/{stored}"), 1_000)) {
            Ok(_) => stored += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(
        stored, 9,
        "each key counts 1,000 value bytes + 3 key bytes + 64"
    );
    assert!(s.usage() <= 10_000 && s.quota.alarm);
    assert!(refused.to_string().contains("\"k/9\""), "{refused}");
    let before = s.clone();
    assert!(apply(&mut s, put("k/9", 1_000)).is_err());
    let long = "n".repeat(500);
    assert!(apply(
        &mut s,
        Op::KvIncrement {
            key: long,
            delta: 1
        }
    )
    .is_err());
    assert_eq!(s, before, "a refused write changes nothing");
    // Overwrites that do not grow, and deletes, go through.
    assert_eq!(apply(&mut s, put("k/0", 900)), Ok(Output::Done));
    assert!(s.quota.alarm, "still above 95% of the quota");
    assert_eq!(
        apply(&mut s, Op::KvDelete { key: "k/1".into() }),
        Ok(Output::Deleted(1))
    );
    assert!(!s.quota.alarm, "usage {} fell below 95%", s.usage());
    assert_eq!(apply(&mut s, put("k/9", 1_000)), Ok(Output::Done));
    // Lifting the quota lifts every refusal.
    assert_eq!(apply(&mut s, Op::SetQuota { bytes: 0 }), Ok(Output::Done));
    assert_eq!(apply(&mut s, put("big", 100_000)), Ok(Output::Done));
}

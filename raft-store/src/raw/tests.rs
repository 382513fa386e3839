use bytes::Bytes;

use super::*;
use crate::error::OpError;

fn b(s: &str) -> Bytes {
    Bytes::from(s.to_string())
}

fn apply(kv: &mut RawKeys, op: RawOp) -> Result<RawOutput, OpError> {
    kv.apply(&op, &mut Vec::new())
}

fn set(kv: &mut RawKeys, k: &str, v: &str) {
    let op = RawOp::Set {
        entries: vec![(b(k), b(v))],
    };
    assert_eq!(apply(kv, op), Ok(RawOutput::Done));
}

fn cas(kv: &mut RawKeys, k: &str, expected: &str, desired: &str) -> Option<Bytes> {
    let op = RawOp::CompareSet {
        key: b(k),
        expected: b(expected),
        desired: b(desired),
    };
    match apply(kv, op) {
        Ok(RawOutput::Value(v)) => v,
        other => panic!("compare_set answered {other:?}"),
    }
}

#[test]
fn keys_are_bytes_and_never_normalized() {
    let mut kv = RawKeys::default();
    set(&mut kv, "/a", "1");
    set(&mut kv, "//a", "2");
    set(&mut kv, "/a/", "3");
    assert_eq!(kv.get(b"/a"), Some(&b("1")));
    assert_eq!(kv.get(b"//a"), Some(&b("2")));
    assert_eq!(kv.get(b"/a/"), Some(&b("3")));
    assert_eq!(kv.len(), 3);
    let listed: Vec<_> = kv.keys_with_prefix(b"/a").cloned().collect();
    assert_eq!(listed, vec![b("/a"), b("/a/")]);
}

#[test]
fn compare_set_follows_torch() {
    let mut kv = RawKeys::default();
    // Missing key, non-empty expected: nothing set, the key stays missing.
    assert_eq!(cas(&mut kv, "/k", "x", "y"), None);
    assert!(kv.get(b"/k").is_none());
    // Missing key, empty expected: set.
    assert_eq!(cas(&mut kv, "/k", "", "v1"), Some(b("v1")));
    // Present and different: unchanged, current answered.
    assert_eq!(cas(&mut kv, "/k", "other", "v2"), Some(b("v1")));
    // Present and equal: replaced.
    assert_eq!(cas(&mut kv, "/k", "v1", "v2"), Some(b("v2")));
    // An empty value matches an empty expected value too.
    set(&mut kv, "/e", "");
    assert_eq!(cas(&mut kv, "/e", "", "z"), Some(b("z")));
}

#[test]
fn add_reads_like_stoll_and_refuses_what_it_cannot() {
    let mut kv = RawKeys::default();
    let add = |kv: &mut RawKeys, k: &str, d: i64| {
        apply(
            kv,
            RawOp::Add {
                key: b(k),
                delta: d,
            },
        )
    };
    assert_eq!(add(&mut kv, "/n", 5), Ok(RawOutput::Count(5)));
    assert_eq!(add(&mut kv, "/n", -7), Ok(RawOutput::Count(-2)));
    assert_eq!(kv.get(b"/n"), Some(&b("-2")));
    set(&mut kv, "/s", "  12abc");
    assert_eq!(add(&mut kv, "/s", 1), Ok(RawOutput::Count(13)));
    set(&mut kv, "/t", "abc");
    assert!(matches!(
        add(&mut kv, "/t", 1),
        Err(OpError::NotAnInteger { .. })
    ));
    set(&mut kv, "/big", &i64::MAX.to_string());
    assert!(matches!(
        add(&mut kv, "/big", 1),
        Err(OpError::Overflow { .. })
    ));
    set(&mut kv, "/huge", "99999999999999999999");
    assert!(matches!(
        add(&mut kv, "/huge", 0),
        Err(OpError::Overflow { .. })
    ));
    assert_eq!(stoll(b"-9223372036854775808"), Ok(i64::MIN));
    assert_eq!(stoll(b"+7"), Ok(7));
    assert_eq!(stoll(b"-"), Err(NotInteger::NoDigits));
}

#[test]
fn append_delete_and_queues() {
    let mut kv = RawKeys::default();
    let mut touched = Vec::new();
    for part in ["a", "b", "c"] {
        let op = RawOp::Append {
            key: b("/x"),
            value: b(part),
        };
        kv.apply(&op, &mut touched).expect("append");
    }
    assert_eq!(kv.get(b"/x"), Some(&b("abc")));
    assert_eq!(touched.len(), 3);
    let del = |kv: &mut RawKeys| apply(kv, RawOp::Delete { key: b("/x") });
    assert_eq!(del(&mut kv), Ok(RawOutput::Count(1)));
    assert_eq!(del(&mut kv), Ok(RawOutput::Count(0)));

    assert!(!kv.ready(b"/q"));
    for v in ["1", "2"] {
        let op = RawOp::QueuePush {
            key: b("/q"),
            value: b(v),
        };
        apply(&mut kv, op).expect("push");
    }
    assert!(kv.ready(b"/q"), "a non-empty queue satisfies a wait");
    assert_eq!(kv.len(), 0, "queues are not keys");
    assert_eq!(kv.queue_len(b"/q"), 2);
    let pop = |kv: &mut RawKeys, block| {
        apply(
            kv,
            RawOp::QueuePop {
                key: b("/q"),
                block,
            },
        )
    };
    let popped = |v: Option<&str>, length| {
        Ok(RawOutput::Popped {
            value: v.map(b),
            length,
        })
    };
    assert_eq!(pop(&mut kv, false), popped(Some("1"), 2));
    assert_eq!(pop(&mut kv, true), popped(Some("2"), 1));
    assert_eq!(pop(&mut kv, false), popped(None, 0));
    assert!(matches!(
        pop(&mut kv, true),
        Err(OpError::QueueEmpty { .. })
    ));
    assert!(kv.is_empty());
    assert_eq!(kv.bytes(), 0);
}

#[test]
fn bytes_follow_every_change_and_survive_a_round_trip() {
    let mut kv = RawKeys::default();
    set(&mut kv, "/a", "12345");
    set(&mut kv, "/a", "1");
    apply(
        &mut kv,
        RawOp::QueuePush {
            key: b("/q"),
            value: b("zz"),
        },
    )
    .expect("push");
    apply(
        &mut kv,
        RawOp::Add {
            key: b("/n"),
            delta: 3,
        },
    )
    .expect("add");
    let expected = value_bytes(b"/a", b"1") + value_bytes(b"/q", b"zz") + value_bytes(b"/n", b"3");
    assert_eq!(kv.bytes(), expected);
    let encoded = crate::codec::encode("raw", &kv).expect("encode");
    let back: RawKeys = crate::codec::decode("raw", &encoded).expect("decode");
    assert_eq!(back, kv);
    assert_eq!(back.bytes(), expected);
    // Growth is an upper bound of what the op adds.
    let op = RawOp::Append {
        key: b("/a"),
        value: b("xyz"),
    };
    let growth = kv.growth_of(&op);
    let before = kv.bytes();
    apply(&mut kv, op).expect("append");
    assert!(kv.bytes() - before <= growth);
}

/// Through the whole state: a retried add applies once; a blocking pop of an empty queue is not
/// remembered, so the same request, applied again after a push, takes the value; the quota
/// refuses a raw write that would pass it.
#[test]
fn request_ids_make_raw_ops_exactly_once() {
    use crate::command::{Command, Output, Proposal};
    use crate::error::RequestId;
    use crate::{CoordState, Op};
    let mut s = CoordState::default();
    let mut ch = Vec::new();
    let cmd = |seq, op| Command {
        request: Some(RequestId {
            client: 3,
            seq,
            acked_below: 1,
        }),
        op: Op::Raw(op),
    };
    let add = || RawOp::Add {
        key: b("/n"),
        delta: 2,
    };
    let first = s.apply(&Proposal::new(1, vec![cmd(1, add())]), &mut ch);
    let again = s.apply(&Proposal::new(2, vec![cmd(1, add())]), &mut ch);
    assert_eq!(first, again);
    assert_eq!(first, vec![Ok(Output::Raw(RawOutput::Count(2)))]);
    assert_eq!(s.kv.raw().get(b"/n"), Some(&b("2")));

    let pop = || RawOp::QueuePop {
        key: b("/q"),
        block: true,
    };
    let empty = s.apply(&Proposal::new(3, vec![cmd(2, pop())]), &mut ch);
    assert!(matches!(empty[0], Err(OpError::QueueEmpty { .. })));
    let push = RawOp::QueuePush {
        key: b("/q"),
        value: b("v"),
    };
    s.apply(&Proposal::new(4, vec![cmd(3, push)]), &mut ch);
    let taken = s.apply(&Proposal::new(5, vec![cmd(2, pop())]), &mut ch);
    let popped = RawOutput::Popped {
        value: Some(b("v")),
        length: 1,
    };
    assert_eq!(taken, vec![Ok(Output::Raw(popped))]);
    assert!(ch.contains(&crate::Change::RawChanged { key: b("/q") }));

    s.apply(
        &Proposal::new(
            6,
            vec![Command {
                request: None,
                op: Op::SetQuota { bytes: 1024 },
            }],
        ),
        &mut ch,
    );
    let big = RawOp::Set {
        entries: vec![(b("/big"), Bytes::from(vec![0u8; 2048]))],
    };
    let refused = s.apply(&Proposal::new(7, vec![cmd(4, big)]), &mut ch);
    assert!(
        matches!(
            &refused[0],
            Err(OpError::Status {
                code: crate::error::Code::ResourceExhausted,
                ..
            })
        ),
        "{refused:?}"
    );
    assert!(s.kv.raw().get(b"/big").is_none());
}

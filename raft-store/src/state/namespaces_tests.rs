//! Namespaces keep their worlds apart: the same key, task and request id in two namespaces are
//! two; limits refuse before anything changes and name the namespace; a deleted namespace is gone
//! whole, and its name comes back fresh.

use bytes::Bytes;

use crate::command::{Command, Op, Output, Proposal};
use crate::error::{Code, OpError, RequestId};
use crate::state::{Change, ClusterConfig, CoordState, NamespaceLimits, TaskName};

fn rid(client: u64, seq: u64) -> Option<RequestId> {
    Some(RequestId {
        client,
        seq,
        acked_below: 1,
    })
}

fn put(key: &str, value: &str) -> Op {
    Op::KvPut {
        key: key.into(),
        value: Bytes::from(value.to_string()),
        overwrite: false,
    }
}

fn within(ns: &str, op: Op) -> Op {
    Op::InNamespace {
        namespace: ns.into(),
        op: Box::new(op),
    }
}

fn workers(n: u32) -> ClusterConfig {
    ClusterConfig {
        jobs: [("worker".to_string(), n)].into_iter().collect(),
        heartbeat_timeout_ms: 10_000,
        ..ClusterConfig::default()
    }
}

fn declare(ns: &str, config: ClusterConfig, limits: NamespaceLimits) -> Op {
    Op::DeclareNamespace {
        namespace: ns.into(),
        config,
        limits,
        service_incarnation: 77,
    }
}

/// Applies one command per proposal and returns their results.
fn run(s: &mut CoordState, cmds: Vec<(Option<RequestId>, Op)>) -> Vec<Result<Output, OpError>> {
    let mut changes = Vec::new();
    cmds.into_iter()
        .enumerate()
        .map(|(i, (request, op))| {
            let p = Proposal::new(1000 + i as u64, vec![Command { request, op }]);
            s.apply(&p, &mut changes).remove(0)
        })
        .collect()
}

fn code(r: &Result<Output, OpError>) -> Option<Code> {
    match r {
        Err(OpError::Status { code, .. }) => Some(*code),
        _ => None,
    }
}

fn message(r: &Result<Output, OpError>) -> String {
    match r {
        Err(OpError::Status { message, .. }) => message.clone(),
        other => format!("{other:?}"),
    }
}

#[test]
fn the_same_key_task_and_request_id_in_two_namespaces_are_two() {
    let mut s = CoordState::default();
    let register = |ns: &str| {
        within(
            ns,
            Op::RegisterTask {
                task: TaskName::new("worker", 0),
                incarnation: 1,
            },
        )
    };
    let out = run(
        &mut s,
        vec![
            (None, declare("a", workers(2), NamespaceLimits::default())),
            (None, declare("b", workers(2), NamespaceLimits::default())),
            (rid(1, 1), within("a", put("k", "in a"))),
            // The same client and request id in b: a different session, applied.
            (rid(1, 1), within("b", put("k", "in b"))),
            (rid(2, 1), put("k", "default")),
            (None, register("a")),
        ],
    );
    assert!(out.iter().all(Result::is_ok), "{out:?}");
    let value = |ns: Option<&str>| {
        s.space(ns)
            .and_then(|sp| sp.kv.get("k"))
            .map(|e| e.value.clone())
    };
    assert_eq!(value(Some("a")), Some(Bytes::from("in a")));
    assert_eq!(value(Some("b")), Some(Bytes::from("in b")));
    assert_eq!(value(None), Some(Bytes::from("default")));
    let connected = |ns: &str| {
        s.space(Some(ns))
            .and_then(|sp| sp.cluster.as_ref())
            .map(|c| c.tasks.count_in(crate::state::TaskState::Connected))
    };
    assert_eq!(connected("a"), Some(1));
    assert_eq!(connected("b"), Some(0), "a's registration is a's alone");
    assert!(s.cluster.is_none(), "the default namespace has no job yet");
}

#[test]
fn changes_of_a_namespace_are_reported_as_its_own() {
    let mut s = CoordState::default();
    let mut changes = Vec::new();
    for op in [
        declare("a", workers(1), NamespaceLimits::default()),
        within("a", put("k", "v")),
    ] {
        s.apply(
            &Proposal::new(1, vec![Command { request: None, op }]),
            &mut changes,
        );
    }
    assert!(matches!(&changes[0], Change::NamespaceDeclared { namespace } if namespace == "a"));
    assert!(matches!(
        &changes[1],
        Change::InNamespace { namespace, change } if namespace == "a"
            && matches!(**change, Change::KvPut { ref key, .. } if key == "k")
    ));
}

#[test]
fn a_second_declaration_must_match_and_names_the_differences() {
    let mut s = CoordState::default();
    let limits = NamespaceLimits {
        max_keys: 5,
        ..NamespaceLimits::default()
    };
    let out = run(
        &mut s,
        vec![
            (None, declare("a", workers(2), limits)),
            (None, declare("a", workers(2), limits)),
            (None, declare("a", workers(4), NamespaceLimits::default())),
        ],
    );
    assert_eq!(
        out[0],
        Ok(Output::Declared {
            created: true,
            service_incarnation: 77
        })
    );
    assert_eq!(
        out[1],
        Ok(Output::Declared {
            created: false,
            service_incarnation: 77
        })
    );
    assert_eq!(code(&out[2]), Some(Code::FailedPrecondition));
    let m = message(&out[2]);
    assert!(
        m.contains("\"a\"") && m.contains("jobs") && m.contains("max_keys 5"),
        "{m}"
    );
}

#[test]
fn bad_names_and_the_default_are_refused() {
    let mut s = CoordState::default();
    let out = run(
        &mut s,
        vec![
            (
                None,
                declare("a/..", workers(1), NamespaceLimits::default()),
            ),
            (
                None,
                declare("default", workers(1), NamespaceLimits::default()),
            ),
            (None, within("nowhere", put("k", "v"))),
            (
                None,
                Op::DeleteNamespace {
                    namespace: "default".into(),
                },
            ),
        ],
    );
    assert_eq!(code(&out[0]), Some(Code::InvalidArgument));
    assert_eq!(code(&out[1]), Some(Code::InvalidArgument));
    assert_eq!(code(&out[2]), Some(Code::NotFound));
    assert!(message(&out[2]).contains("\"nowhere\""));
    assert_eq!(code(&out[3]), Some(Code::InvalidArgument));
    assert_eq!(s, CoordState::default(), "nothing changed");
}

#[test]
fn ops_of_the_ensemble_are_refused_inside_a_namespace() {
    let mut s = CoordState::default();
    run(
        &mut s,
        vec![(None, declare("a", workers(1), NamespaceLimits::default()))],
    );
    let before = s.clone();
    let out = run(
        &mut s,
        vec![
            (None, within("a", Op::SetQuota { bytes: 1 })),
            (None, within("a", within("b", put("k", "v")))),
            (
                None,
                within("a", declare("c", workers(1), NamespaceLimits::default())),
            ),
        ],
    );
    assert!(out.iter().all(|r| code(r) == Some(Code::InvalidArgument)));
    assert_eq!(s, before);
}

#[test]
fn a_namespace_at_its_limits_is_refused_and_the_others_go_on() {
    let mut s = CoordState::default();
    let limits = NamespaceLimits {
        max_keys: 2,
        max_bytes: 1000,
        ..NamespaceLimits::default()
    };
    run(
        &mut s,
        vec![
            (None, declare("noisy", workers(1), limits)),
            (
                None,
                declare("quiet", workers(1), NamespaceLimits::default()),
            ),
        ],
    );
    let out = run(
        &mut s,
        vec![
            (None, within("noisy", put("a", "1"))),
            (None, within("noisy", put("b", "2"))),
            (None, within("noisy", put("c", "3"))),
            (
                None,
                within(
                    "noisy",
                    Op::KvPut {
                        key: "a".into(),
                        value: Bytes::from(vec![b'x'; 2000]),
                        overwrite: true,
                    },
                ),
            ),
            // An overwrite that does not grow, and a delete, still go through.
            (
                None,
                within(
                    "noisy",
                    Op::KvPut {
                        key: "a".into(),
                        value: Bytes::from("0"),
                        overwrite: true,
                    },
                ),
            ),
            (None, within("quiet", put("c", "3"))),
            (None, within("quiet", put("d", "4"))),
            (None, within("quiet", put("e", "5"))),
        ],
    );
    assert!(out[0].is_ok() && out[1].is_ok());
    assert_eq!(code(&out[2]), Some(Code::ResourceExhausted));
    assert!(
        message(&out[2]).contains("namespace \"noisy\" holds 2 keys"),
        "{}",
        message(&out[2])
    );
    assert_eq!(code(&out[3]), Some(Code::ResourceExhausted));
    assert!(
        message(&out[3]).contains("max_bytes"),
        "{}",
        message(&out[3])
    );
    assert!(out[4].is_ok(), "{:?}", out[4]);
    assert!(out[5..].iter().all(Result::is_ok), "quiet: {:?}", &out[5..]);
    let noisy = s.namespaces.get("noisy").expect("noisy");
    assert_eq!(noisy.space.key_count(), 2);
    assert!(noisy.space.kv.get("c").is_none());
}

#[test]
fn the_ensemble_quota_counts_every_namespace() {
    let mut s = CoordState::default();
    let big = || Bytes::from(vec![b'x'; 600]);
    let out = run(
        &mut s,
        vec![
            (None, Op::SetQuota { bytes: 1000 }),
            (None, declare("a", workers(1), NamespaceLimits::default())),
            (
                None,
                within(
                    "a",
                    Op::KvPut {
                        key: "k".into(),
                        value: big(),
                        overwrite: false,
                    },
                ),
            ),
            (
                None,
                Op::KvPut {
                    key: "k".into(),
                    value: big(),
                    overwrite: false,
                },
            ),
        ],
    );
    assert!(out[..3].iter().all(Result::is_ok), "{out:?}");
    assert_eq!(code(&out[3]), Some(Code::ResourceExhausted));
    assert!(
        message(&out[3]).contains("--quota-bytes"),
        "{}",
        message(&out[3])
    );
    assert!(s.kv.get("k").is_none());
    assert!(s.usage() > s.default.usage() + 600);
}

#[test]
fn a_deleted_namespace_is_gone_whole_and_its_name_comes_back_fresh() {
    let mut s = CoordState::default();
    run(
        &mut s,
        vec![
            (None, declare("a", workers(1), NamespaceLimits::default())),
            (rid(1, 1), within("a", put("k", "old"))),
        ],
    );
    let with_a = s.usage();
    let out = run(
        &mut s,
        vec![
            (
                None,
                Op::DeleteNamespace {
                    namespace: "a".into(),
                },
            ),
            (None, within("a", put("k", "lost"))),
            (None, declare("a", workers(3), NamespaceLimits::default())),
            // The same request id as before the delete: a fresh session, applied.
            (rid(1, 1), within("a", put("k", "new"))),
        ],
    );
    assert_eq!(out[0], Ok(Output::Done));
    assert_eq!(code(&out[1]), Some(Code::NotFound));
    assert!(out[2].is_ok() && out[3].is_ok(), "{out:?}");
    let a = s.namespaces.get("a").expect("a again");
    assert_eq!(a.config.task_count(), 3);
    assert_eq!(
        a.space.kv.get("k").map(|e| e.value.clone()),
        Some(Bytes::from("new"))
    );
    let mut emptied = s.clone();
    run(
        &mut emptied,
        vec![(
            None,
            Op::DeleteNamespace {
                namespace: "a".into(),
            },
        )],
    );
    assert!(emptied.usage() < with_a);
    assert!(emptied.namespaces.is_empty());
}

#[test]
fn a_job_over_its_task_limit_is_not_declared() {
    let mut s = CoordState::default();
    let out = run(
        &mut s,
        vec![(
            None,
            declare(
                "a",
                workers(8),
                NamespaceLimits {
                    max_tasks: 4,
                    ..NamespaceLimits::default()
                },
            ),
        )],
    );
    assert_eq!(code(&out[0]), Some(Code::ResourceExhausted));
    assert!(message(&out[0]).contains("max_tasks"));
    assert!(s.namespaces.is_empty());
}

#[test]
fn an_empty_namespace_is_small() {
    let mut s = CoordState::default();
    run(
        &mut s,
        vec![(None, declare("a", workers(16), NamespaceLimits::default()))],
    );
    let bytes = crate::codec::encoded_len(&s.namespaces);
    assert!(
        bytes <= 4096,
        "an empty namespace of 16 tasks takes {bytes} bytes"
    );
}

#[test]
fn a_namespace_expires_only_idle_since_the_leader_saw_it_with_no_task_connected() {
    let mut s = CoordState::default();
    let mut changes = Vec::new();
    let mut at = |s: &mut CoordState, ms: u64, op: Op| {
        s.apply(
            &Proposal::new(ms, vec![Command { request: None, op }]),
            &mut changes,
        )
        .remove(0)
    };
    let limits = NamespaceLimits {
        ttl_ms: 1_000,
        ..NamespaceLimits::default()
    };
    assert!(at(&mut s, 1_000, declare("t", workers(1), limits)).is_ok());
    let register = Op::RegisterTask {
        task: TaskName::new("worker", 0),
        incarnation: 1,
    };
    assert!(at(&mut s, 2_000, within("t", register)).is_ok());
    let ns = s.namespaces.get("t").expect("t");
    assert!(!ns.expired_at(10_000), "a connected task keeps it");
    let expire = |since| Op::ExpireNamespace {
        namespace: "t".into(),
        idle_since_ms: since,
    };
    assert_eq!(
        code(&at(&mut s, 10_000, expire(2_000))),
        Some(Code::FailedPrecondition)
    );
    let shutdown = Op::ResetTask {
        task: TaskName::new("worker", 0),
    };
    assert!(at(&mut s, 3_000, within("t", shutdown)).is_ok());
    let ns = s.namespaces.get("t").expect("t");
    assert!(!ns.expired_at(3_500) && ns.expired_at(4_000));
    // Seen idle since 3,000, but used again at 3,900: kept.
    assert!(at(&mut s, 3_900, within("t", put("k", "v"))).is_ok());
    assert_eq!(
        code(&at(&mut s, 4_000, expire(3_000))),
        Some(Code::FailedPrecondition)
    );
    assert!(at(&mut s, 5_000, expire(3_900)).is_ok());
    assert!(s.namespaces.is_empty());
}

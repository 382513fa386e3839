//! A linearizability checker in the style of Wing & Gong / Lowe (as porcupine does): search for an
//! order of the operations, consistent with real time, in which a sequential model explains every
//! observed result.
//!
//! An operation whose outcome is unknown (the client gave up, the request may or may not have been
//! applied) may take effect at any point after it was invoked, or never. A search state is the set
//! of operations already placed plus the model's state; states seen before are not explored again,
//! which keeps histories with a handful of concurrent clients cheap.

use std::collections::HashSet;
use std::hash::Hash;

/// A sequential specification.
pub trait Model: Clone + Eq + Hash {
    type Op;
    type Ret: PartialEq + std::fmt::Debug;
    /// The state after `op`, and what `op` returns in this state.
    fn step(&self, op: &Self::Op) -> (Self, Self::Ret);
}

/// One operation of a history. Times are microseconds since the run started.
#[derive(Clone, Debug)]
pub struct Entry<Op, Ret> {
    pub op: Op,
    /// What the client saw; `None` = unknown outcome.
    pub ret: Option<Ret>,
    pub invoke: u64,
    /// `None` = never completed (outcome unknown).
    pub complete: Option<u64>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order explains the history. `stuck_at` is an operation no order could place (index into
    /// the history as given).
    NotLinearizable {
        stuck_at: usize,
    },
    /// The search exceeded its budget of states: no verdict.
    Inconclusive,
}

/// A compact set of operation indexes.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Placed(Vec<u64>);

impl Placed {
    fn new(n: usize) -> Self {
        Self(vec![0; n.div_ceil(64)])
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn with(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.0[i / 64] |= 1 << (i % 64);
        p
    }
}

/// Checks `history` against `init`, exploring at most `budget` search states.
pub fn check<M: Model>(init: M, history: &[Entry<M::Op, M::Ret>], budget: usize) -> Verdict {
    // Work in invocation order; remember where each came from.
    let mut order: Vec<usize> = (0..history.len()).collect();
    order.sort_by_key(|&i| history[i].invoke);
    let h: Vec<&Entry<M::Op, M::Ret>> = order.iter().map(|&i| &history[i]).collect();
    let n = h.len();
    let definite = h.iter().filter(|e| e.ret.is_some()).count();

    let mut seen: HashSet<(Placed, M)> = HashSet::new();
    let mut stack: Vec<(Placed, M, usize)> = vec![(Placed::new(n), init, 0)];
    // The operation that was hardest to place, for the report.
    let mut deepest = (0usize, 0usize);
    while let Some((placed, state, done)) = stack.pop() {
        if done == definite {
            return Verdict::Linearizable;
        }
        if !seen.insert((placed.clone(), state.clone())) {
            continue;
        }
        if seen.len() > budget {
            return Verdict::Inconclusive;
        }
        // The next operation must be invoked before every unplaced, completed operation ended.
        let deadline = h
            .iter()
            .enumerate()
            .filter(|(i, e)| !placed.has(*i) && e.ret.is_some())
            .filter_map(|(_, e)| e.complete)
            .min()
            .unwrap_or(u64::MAX);
        for (i, e) in h.iter().enumerate() {
            if e.invoke > deadline {
                break;
            }
            if placed.has(i) {
                continue;
            }
            let (next, ret) = state.step(&e.op);
            let fits = match &e.ret {
                None => true,
                Some(r) => *r == ret,
            };
            if fits {
                let done_after = done + usize::from(e.ret.is_some());
                stack.push((placed.with(i), next, done_after));
            } else if e.ret.is_some() && done >= deepest.0 {
                deepest = (done, i);
            }
        }
    }
    Verdict::NotLinearizable {
        stuck_at: order.get(deepest.1).copied().unwrap_or(0),
    }
}

/// One key of the key-value store, as the chaos clients use it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Register(pub Option<String>);

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub enum KvOp {
    /// Insert if absent.
    Insert(String),
    /// Overwrite.
    Put(String),
    Get,
    Increment(i64),
    Delete,
    /// torch's COMPARE_SET: `desired` if the value is `expected` (a missing key matches an empty
    /// `expected`); answers the value after the call, or `expected` for a missing key.
    CompareSet {
        expected: String,
        desired: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum KvRet {
    Ok,
    /// Insert found the key present.
    Exists,
    Value(Option<String>),
    Number(i64),
}

impl Model for Register {
    type Op = KvOp;
    type Ret = KvRet;

    fn step(&self, op: &KvOp) -> (Self, KvRet) {
        match op {
            KvOp::Insert(v) => match &self.0 {
                None => (Register(Some(v.clone())), KvRet::Ok),
                Some(_) => (self.clone(), KvRet::Exists),
            },
            KvOp::Put(v) => (Register(Some(v.clone())), KvRet::Ok),
            KvOp::Get => (self.clone(), KvRet::Value(self.0.clone())),
            KvOp::Increment(d) => {
                let n = self
                    .0
                    .as_deref()
                    .and_then(|s| s.parse::<i64>().ok())
                    .unwrap_or(0)
                    + d;
                (Register(Some(n.to_string())), KvRet::Number(n))
            }
            KvOp::Delete => (Register(None), KvRet::Ok),
            KvOp::CompareSet { expected, desired } => match &self.0 {
                Some(v) if v != expected => (self.clone(), KvRet::Value(Some(v.clone()))),
                None if !expected.is_empty() => {
                    (self.clone(), KvRet::Value(Some(expected.clone())))
                }
                _ => (
                    Register(Some(desired.clone())),
                    KvRet::Value(Some(desired.clone())),
                ),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(op: KvOp, ret: Option<KvRet>, invoke: u64, complete: Option<u64>) -> Entry<KvOp, KvRet> {
        Entry {
            op,
            ret,
            invoke,
            complete,
        }
    }

    fn get(v: Option<&str>, invoke: u64, complete: u64) -> Entry<KvOp, KvRet> {
        e(
            KvOp::Get,
            Some(KvRet::Value(v.map(str::to_string))),
            invoke,
            Some(complete),
        )
    }

    #[test]
    fn sequential_and_concurrent_histories_pass() {
        let h = vec![
            e(KvOp::Put("a".into()), Some(KvRet::Ok), 0, Some(10)),
            get(Some("a"), 20, 30),
            // Concurrent put and get: the get may see either value.
            e(KvOp::Put("b".into()), Some(KvRet::Ok), 40, Some(60)),
            get(Some("a"), 45, 50),
            get(Some("b"), 70, 80),
        ];
        assert_eq!(
            check(Register::default(), &h, 100_000),
            Verdict::Linearizable
        );
    }

    #[test]
    fn a_stale_read_is_caught() {
        let h = vec![
            e(KvOp::Put("a".into()), Some(KvRet::Ok), 0, Some(10)),
            e(KvOp::Put("b".into()), Some(KvRet::Ok), 20, Some(30)),
            // Reads "a" after "b" was acknowledged: not linearizable.
            get(Some("a"), 40, 50),
        ];
        assert!(matches!(
            check(Register::default(), &h, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn a_lost_write_is_caught() {
        let h = vec![
            e(KvOp::Insert("x".into()), Some(KvRet::Ok), 0, Some(10)),
            get(None, 20, 30),
        ];
        assert!(matches!(
            check(Register::default(), &h, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn a_double_increment_is_caught_and_unknowns_may_or_may_not_apply() {
        let inc = |ret: Option<i64>, invoke, complete| {
            e(KvOp::Increment(1), ret.map(KvRet::Number), invoke, complete)
        };
        // An increment with unknown outcome, then one that saw 1: the first never applied.
        let h = vec![inc(None, 0, None), inc(Some(1), 10, Some(20))];
        assert_eq!(
            check(Register::default(), &h, 100_000),
            Verdict::Linearizable
        );
        // ... or it did, later.
        let h = vec![
            inc(None, 0, None),
            inc(Some(1), 10, Some(20)),
            get(Some("2"), 30, 40),
        ];
        assert_eq!(
            check(Register::default(), &h, 100_000),
            Verdict::Linearizable
        );
        // Two acknowledged increments cannot both return 1.
        let h = vec![inc(Some(1), 0, Some(10)), inc(Some(1), 20, Some(30))];
        assert!(matches!(
            check(Register::default(), &h, 100_000),
            Verdict::NotLinearizable { .. }
        ));
        // An unknown operation cannot take effect before it was invoked.
        let h = vec![
            get(Some("5"), 0, 10),
            e(KvOp::Put("5".into()), None, 20, None),
        ];
        assert!(matches!(
            check(Register::default(), &h, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn insert_if_absent_semantics() {
        let h = vec![
            e(KvOp::Insert("a".into()), Some(KvRet::Ok), 0, Some(10)),
            e(KvOp::Insert("b".into()), Some(KvRet::Exists), 20, Some(30)),
            get(Some("a"), 40, 50),
        ];
        assert_eq!(
            check(Register::default(), &h, 100_000),
            Verdict::Linearizable
        );
        let h = vec![
            e(KvOp::Insert("a".into()), Some(KvRet::Ok), 0, Some(10)),
            e(KvOp::Insert("b".into()), Some(KvRet::Ok), 20, Some(30)),
        ];
        assert!(matches!(
            check(Register::default(), &h, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }

    #[test]
    fn compare_set_follows_torch() {
        let cas = |expected: &str, desired: &str, ret: &str, invoke, complete| {
            e(
                KvOp::CompareSet {
                    expected: expected.into(),
                    desired: desired.into(),
                },
                Some(KvRet::Value(Some(ret.into()))),
                invoke,
                Some(complete),
            )
        };
        let h = vec![
            // A missing key answers a non-empty `expected` and stays missing.
            cas("x", "a", "x", 0, 10),
            get(None, 20, 30),
            // An empty `expected` matches a missing key.
            cas("", "a", "a", 40, 50),
            cas("z", "b", "a", 60, 70),
            cas("a", "b", "b", 80, 90),
        ];
        assert_eq!(
            check(Register::default(), &h, 100_000),
            Verdict::Linearizable
        );
        // A compare-and-set that succeeded twice in a row on the same expected value.
        let h = vec![cas("", "a", "a", 0, 10), cas("", "b", "b", 20, 30)];
        assert!(matches!(
            check(Register::default(), &h, 100_000),
            Verdict::NotLinearizable { .. }
        ));
    }
}

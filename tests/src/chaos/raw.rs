//! What the raw-key clients (torch's store operations, `raw_clients`) recorded, and the checks
//! that prove each operation applied exactly once across the faults.
//!
//! ADD, COMPARE_SET and their GETs go into the key-value histories and are checked for
//! linearizability with the rest (a doubled ADD shows there). The operations here have no model
//! small enough for that search, so each is judged by what the run ends with:
//!
//! - APPEND of unique tokens to one value: every acknowledged token is in the final value exactly
//!   once, a token of unknown outcome at most once, nothing else is, and each client's
//!   acknowledged tokens are in the order it appended them.
//! - QUEUE_PUSH of unique tokens, QUEUE_POP, and the queue drained at the end: nothing popped
//!   twice or popped that was never pushed, each client's acknowledged tokens leave in the order
//!   they went in, and no acknowledged push is missing unless as many pops lost their answers.
//! - counted BARRIER (every client arrives at instance 0, 1, …): the counts answered for an
//!   instance are distinct, nobody is released before every client arrived, and a released
//!   instance's counter ends at the number of clients (no arrival counted twice).
//! - WAIT on a key another task sets a little later: never released before that set began.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum RawOp {
    Append(String),
    Push(String),
    Pop,
    /// An arrival at instance N of the counted barrier.
    Barrier(u64),
    Wait(String),
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum RawRet {
    Ok,
    Popped(Option<String>),
    /// A barrier's counter after this arrival.
    Count(i64),
    /// A wait released; when the set it waited for began (`None`: it had not).
    Released(Option<u64>),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RawRecord {
    pub client: usize,
    pub op: RawOp,
    /// `None`: unknown outcome.
    pub ret: Option<RawRet>,
    pub invoke_us: u64,
    pub complete_us: Option<u64>,
}

/// What the raw keys held once the run was over.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RawFinal {
    /// The appended value.
    pub log: String,
    /// The queue, popped until empty, in order.
    pub drained: Vec<String>,
    /// Each barrier instance's counter.
    pub counters: BTreeMap<u64, i64>,
    /// Clients taking part in every barrier instance.
    pub world: i64,
}

/// The tokens of an APPEND value.
pub const TOKEN_END: char = ';';

/// The client and sequence number of a token `c{client}.{n}`.
fn token_order(token: &str) -> Option<(usize, u64)> {
    let (c, n) = token.strip_prefix('c')?.split_once('.')?;
    Some((c.parse().ok()?, n.parse().ok()?))
}

/// Every check of the raw-key records against the final state; the anomalies found.
pub fn check(records: &[RawRecord], end: &RawFinal) -> Vec<String> {
    let mut out = check_appends(records, &end.log);
    out.extend(check_queue(records, &end.drained));
    out.extend(check_counted_barriers(records, end));
    out.extend(check_waits(records));
    out
}

/// Tokens written by `op` (acknowledged, unknown) from `records`.
fn written(records: &[RawRecord], op: fn(&RawOp) -> Option<&String>) -> HashMap<&str, bool> {
    records
        .iter()
        .filter_map(|r| op(&r.op).map(|t| (t.as_str(), r.ret.is_some())))
        .collect()
}

/// Tokens in `seq` that break their client's order of acknowledged writes.
fn out_of_order<'a>(
    seq: impl Iterator<Item = &'a str>,
    acked: &HashMap<&str, bool>,
) -> Option<String> {
    let mut last: HashMap<usize, u64> = HashMap::new();
    for t in seq {
        if acked.get(t) != Some(&true) {
            continue;
        }
        let (c, n) = token_order(t)?;
        if last.get(&c).is_some_and(|&l| l > n) {
            return Some(format!("token {t:?} after a later one of client {c}"));
        }
        last.insert(c, n);
    }
    None
}

fn check_appends(records: &[RawRecord], log: &str) -> Vec<String> {
    let appended = written(records, |op| match op {
        RawOp::Append(t) => Some(t),
        _ => None,
    });
    let tokens: Vec<&str> = log.split(TOKEN_END).filter(|t| !t.is_empty()).collect();
    let mut count: HashMap<&str, usize> = HashMap::new();
    for t in &tokens {
        *count.entry(t).or_default() += 1;
    }
    let mut out = Vec::new();
    for (t, n) in &count {
        match appended.get(t) {
            None => out.push(format!(
                "APPEND: {t:?} is in the value but nobody appended it"
            )),
            Some(_) if *n > 1 => out.push(format!("APPEND: {t:?} applied {n} times")),
            Some(_) => {}
        }
    }
    for (t, acked) in &appended {
        if *acked && !count.contains_key(t) {
            out.push(format!("APPEND: acknowledged {t:?} is not in the value"));
        }
    }
    if let Some(e) = out_of_order(tokens.iter().copied(), &appended) {
        out.push(format!("APPEND: {e}"));
    }
    out
}

fn check_queue(records: &[RawRecord], drained: &[String]) -> Vec<String> {
    let pushed = written(records, |op| match op {
        RawOp::Push(t) => Some(t),
        _ => None,
    });
    let popped_in_run = records.iter().filter_map(|r| match (&r.op, &r.ret) {
        (RawOp::Pop, Some(RawRet::Popped(Some(v)))) => Some(v.as_str()),
        _ => None,
    });
    let lost_pops = records
        .iter()
        .filter(|r| matches!(r.op, RawOp::Pop) && r.ret.is_none())
        .count();
    let mut out = Vec::new();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for v in popped_in_run.chain(drained.iter().map(String::as_str)) {
        *seen.entry(v).or_default() += 1;
    }
    for (v, n) in &seen {
        if !pushed.contains_key(v) {
            out.push(format!("QUEUE: popped {v:?}, which nobody pushed"));
        } else if *n > 1 {
            out.push(format!("QUEUE: {v:?} popped {n} times"));
        }
    }
    let missing: Vec<&&str> = pushed
        .iter()
        .filter(|(v, acked)| **acked && !seen.contains_key(**v))
        .map(|(v, _)| v)
        .collect();
    if missing.len() > lost_pops {
        out.push(format!(
            "QUEUE: {} acknowledged pushes never came out (e.g. {:?}) and only {lost_pops} pops lost their answers",
            missing.len(),
            missing.first()
        ));
    }
    if let Some(e) = out_of_order(drained.iter().map(String::as_str), &pushed) {
        out.push(format!("QUEUE: drained {e}"));
    }
    out
}

fn check_counted_barriers(records: &[RawRecord], end: &RawFinal) -> Vec<String> {
    let mut by_instance: BTreeMap<u64, Vec<&RawRecord>> = BTreeMap::new();
    for r in records {
        if let RawOp::Barrier(i) = r.op {
            by_instance.entry(i).or_default().push(r);
        }
    }
    let mut out = Vec::new();
    for (i, arrivals) in by_instance {
        let counts: Vec<i64> = arrivals
            .iter()
            .filter_map(|r| match r.ret {
                Some(RawRet::Count(c)) => Some(c),
                _ => None,
            })
            .collect();
        let mut distinct = counts.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != counts.len() {
            out.push(format!(
                "BARRIER #{i}: two arrivals were answered the same count ({counts:?})"
            ));
        }
        let Some(first_release) = arrivals
            .iter()
            .filter(|r| r.ret.is_some())
            .filter_map(|r| r.complete_us)
            .min()
        else {
            continue;
        };
        let last_arrival = arrivals.iter().map(|r| r.invoke_us).max().unwrap_or(0);
        if (arrivals.len() as i64) < end.world || last_arrival > first_release {
            out.push(format!(
                "BARRIER #{i}: released at {first_release} us, before all {} clients arrived ({} had, the last at {last_arrival} us)",
                end.world,
                arrivals.len()
            ));
        }
        match end.counters.get(&i) {
            Some(&c) if c == end.world => {}
            other => out.push(format!(
                "BARRIER #{i}: released, and its counter ends at {other:?} for {} arrivals",
                end.world
            )),
        }
    }
    out
}

fn check_waits(records: &[RawRecord]) -> Vec<String> {
    records
        .iter()
        .filter_map(|r| match (&r.op, &r.ret, r.complete_us) {
            (RawOp::Wait(key), Some(RawRet::Released(set)), Some(done)) => match set {
                Some(s) if *s <= done => None,
                _ => Some(format!(
                    "WAIT of {key:?} released at {done} us, before its key was set (set began at {set:?})"
                )),
            },
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(client: usize, op: RawOp, ret: Option<RawRet>, at: u64) -> RawRecord {
        RawRecord {
            client,
            op,
            complete_us: ret.is_some().then_some(at + 5),
            ret,
            invoke_us: at,
        }
    }

    fn append(t: &str, acked: bool) -> RawRecord {
        rec(0, RawOp::Append(t.into()), acked.then_some(RawRet::Ok), 0)
    }

    #[test]
    fn appends_once_and_in_order() {
        let recs = [
            append("c0.1", true),
            append("c0.2", false),
            append("c0.3", true),
        ];
        let ok = |log: &str| check_appends(&recs, log);
        assert!(ok("c0.1;c0.3;").is_empty());
        assert!(ok("c0.1;c0.2;c0.3;").is_empty());
        // Doubled, lost, foreign, reordered.
        assert_eq!(ok("c0.1;c0.1;c0.3;").len(), 1);
        assert_eq!(ok("c0.1;").len(), 1);
        assert_eq!(ok("c0.1;c9.9;c0.3;").len(), 1);
        assert_eq!(ok("c0.3;c0.1;").len(), 1);
    }

    #[test]
    fn queue_tokens_come_out_once() {
        let push = |t: &str| rec(0, RawOp::Push(t.into()), Some(RawRet::Ok), 0);
        let pop = |v: Option<&str>| {
            rec(
                1,
                RawOp::Pop,
                Some(RawRet::Popped(v.map(str::to_string))),
                10,
            )
        };
        let recs = [push("c0.1"), push("c0.2"), pop(Some("c0.1"))];
        assert!(check_queue(&recs, &["c0.2".into()]).is_empty());
        // c0.1 popped again, c0.2 lost.
        assert_eq!(check_queue(&recs, &["c0.1".into()]).len(), 2);
        // A pop whose answer was lost may have taken c0.2.
        let mut lost = recs.to_vec();
        lost.push(rec(1, RawOp::Pop, None, 20));
        assert!(check_queue(&lost, &[]).is_empty());
    }

    #[test]
    fn a_counted_barrier_counts_each_arrival_once() {
        let arrive = |c, count, at| rec(c, RawOp::Barrier(0), Some(RawRet::Count(count)), at);
        let recs = [arrive(0, 1, 0), arrive(1, 2, 1)];
        let end = |counter| RawFinal {
            counters: [(0, counter)].into(),
            world: 2,
            ..RawFinal::default()
        };
        assert!(check_counted_barriers(&recs, &end(2)).is_empty());
        assert_eq!(check_counted_barriers(&recs, &end(3)).len(), 1);
        let same = [arrive(0, 2, 0), arrive(1, 2, 1)];
        assert_eq!(check_counted_barriers(&same, &end(2)).len(), 1);
    }
}

//! jaxlib's GetAliveTasks under faults: the two tasks of the XLA job `x`, carried by one sidecar,
//! ask about the whole job again and again, both asks in one `XlaAliveAsks` call as coord-proxy
//! sends them (each under a request number of its own, the set sent once), and read each round's
//! answer with `AwaitAlive` (the client: `alive_clients`).
//!
//! An ask names no round: recorded twice (a call re-driven after a leader change, its numbers
//! lost or forgotten), it joins the next round, so the rounds a call's asks joined split or skip
//! one. Checked ([`check`]): both asks of a call join one round, which the call finishes; a call
//! after an answered one joins the next round (after calls with no answer, one of the next few);
//! and each round's answer lists both tasks with the incarnations they registered with.

use serde::{Deserialize, Serialize};

/// The XLA job (the replicas' `--xla-job`) and its tasks.
pub const JOB: &str = "x";
pub const TASKS: i32 = 2;

/// Task `t`'s incarnation.
pub fn incarnation(t: i32) -> u64 {
    0x0a11_0e00 + t as u64
}

/// One ask's answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Joined {
    pub round: i64,
    pub pending: bool,
    pub error_code: i32,
}

/// One call: both tasks' asks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AliveRecord {
    pub invoke_us: u64,
    pub complete_us: Option<u64>,
    /// Each ask's answer, in order; `None`: the call had no answer (its asks may be recorded).
    pub joined: Option<Vec<Joined>>,
    /// The round's answer from `AwaitAlive`: the tasks alive and their incarnations (`None`: not
    /// read, or the wait had no answer).
    pub answer: Option<(Vec<i32>, Vec<u64>)>,
}

/// The checks of the module doc; the anomalies found.
pub fn check(records: &[AliveRecord]) -> Vec<String> {
    let mut out = Vec::new();
    // The last answered call's round, and how many calls without an answer came since.
    let mut last: Option<(i64, usize)> = None;
    for (i, r) in records.iter().enumerate() {
        let Some(joined) = &r.joined else {
            last = last.map(|(round, unknown)| (round, unknown + 1));
            continue;
        };
        let Some(first) = joined.first() else {
            out.push(format!("alive call {i}: no answer for its asks"));
            continue;
        };
        let rounds: Vec<i64> = joined.iter().map(|j| j.round).collect();
        if joined.iter().any(|j| j.error_code != 0) {
            out.push(format!("alive call {i}: an ask failed: {joined:?}"));
            continue;
        }
        if rounds.iter().any(|&g| g != first.round) {
            out.push(format!(
                "alive call {i}: the asks joined different rounds {rounds:?}"
            ));
        }
        if joined.iter().all(|j| j.pending) {
            out.push(format!(
                "alive call {i}: both tasks asked, yet round {} still waits: {joined:?}",
                first.round
            ));
        }
        if let Some((before, unknown)) = last {
            let next = before + 1;
            if first.round < next || first.round > next + unknown as i64 {
                out.push(format!(
                    "alive call {i}: joined round {} after round {before} with {unknown} calls \
                     unanswered between (an ask recorded twice skips a round)",
                    first.round
                ));
            }
        }
        last = Some((first.round, 0));
        let want = ((0..TASKS).collect(), (0..TASKS).map(incarnation).collect());
        if let Some(answer) = &r.answer {
            if *answer != want {
                out.push(format!(
                    "alive call {i}: round {} answered {answer:?}, not every task with its \
                     incarnation {want:?}",
                    first.round
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(rounds: Option<&[(i64, bool)]>) -> AliveRecord {
        AliveRecord {
            invoke_us: 0,
            complete_us: None,
            joined: rounds.map(|r| {
                (r.iter())
                    .map(|&(round, pending)| Joined {
                        round,
                        pending,
                        error_code: 0,
                    })
                    .collect()
            }),
            answer: Some((vec![0, 1], vec![incarnation(0), incarnation(1)])),
        }
    }

    #[test]
    fn rounds_follow_one_another() {
        let ok = [
            call(Some(&[(0, true), (0, false)])),
            call(Some(&[(1, true), (1, false)])),
            call(None),
            call(Some(&[(3, true), (3, false)])),
        ];
        assert_eq!(check(&ok), Vec::<String>::new());
        let skipped = [
            call(Some(&[(0, true), (0, false)])),
            call(Some(&[(2, true), (2, false)])),
        ];
        assert_eq!(check(&skipped).len(), 1, "{:?}", check(&skipped));
        let split = [call(Some(&[(0, true), (1, true)]))];
        assert_eq!(check(&split).len(), 2, "{:?}", check(&split));
        let mut wrong = call(Some(&[(0, true), (0, false)]));
        wrong.answer = Some((vec![0], vec![incarnation(0)]));
        assert_eq!(check(&[wrong]).len(), 1);
    }
}

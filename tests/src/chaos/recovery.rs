//! Recovery: once the last fault has healed, every call completes, with an answer of the
//! service, within a bound.
//!
//! Every wait inside a replica is bounded (docs/design.md, "Every wait is bounded"), and so is
//! each attempt of a client: after the network, the processes and the disks are whole again, a
//! call waits at most for an election and for the longest of those bounds. A call that takes
//! longer, or that fails without an answer once nothing is wrong any more, is a finding, however
//! well the history checks out: a stall with a leader in office (chaos seed 424243: 47 s without
//! a write) is linearizable, and fails every training job whose timeouts are shorter.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The longest election after the faults heal: the lease a voter grants its last leader (the
/// replicas' `--election-timeout-max-ms`, 300 ms) plus the election itself.
pub const ELECTION: Duration = Duration::from_millis(500);

/// The longest single wait a call can meet once nothing is wrong: a leader gives up an entry it
/// could not commit after `proposer::COMMIT_PATIENCE` (3 s), which is longer than a client's
/// attempt timeout (2 s), a follower's patience with a forward (2 s) and a read-index round
/// (1 s).
pub const LARGEST_WAIT: Duration = Duration::from_secs(3);

/// How long after the last heal any call may take.
pub const BOUND: Duration = ELECTION.saturating_add(LARGEST_WAIT);

/// One call of any client of the run: when it was made, when it returned, and whether the
/// service answered it (an error the service chose, such as `ALREADY_EXISTS`, is an answer; a
/// call given up as `UNAVAILABLE` is not).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CallTiming {
    pub what: String,
    pub invoke_us: u64,
    pub returned_us: u64,
    pub answered: bool,
}

/// What the recovery check found.
#[derive(Debug, Default)]
pub struct Recovery {
    /// The longest a call took counted from the last heal (or from its start, if later).
    pub longest: Duration,
    /// Which call that was.
    pub longest_call: String,
    pub anomalies: Vec<String>,
}

/// Checks the calls against `bound`, counted from `healed_us`; calls still running at
/// `stopping_us` (when the clients were told to stop) count up to then.
pub fn check(calls: &[CallTiming], healed_us: u64, stopping_us: u64, bound: Duration) -> Recovery {
    let mut r = Recovery::default();
    let bound_us = u64::try_from(bound.as_micros()).unwrap_or(u64::MAX);
    for c in calls {
        if c.returned_us <= healed_us || c.invoke_us >= stopping_us {
            continue;
        }
        let from = c.invoke_us.max(healed_us);
        let running = c.returned_us > stopping_us;
        let took = c.returned_us.min(stopping_us) - from;
        if took > u64::try_from(r.longest.as_micros()).unwrap_or(u64::MAX) {
            r.longest = Duration::from_micros(took);
            r.longest_call = c.what.clone();
        }
        let at = |us: u64| format!("{:.3}s", us as f64 / 1e6);
        if took > bound_us {
            r.anomalies.push(format!(
                "{} (invoked at {}) {} {:.3}s after the faults healed at {}, past the bound of {bound:?}",
                c.what,
                at(c.invoke_us),
                if running { "was still running" } else { "returned" },
                took as f64 / 1e6,
                at(healed_us)
            ));
        } else if !running && !c.answered {
            r.anomalies.push(format!(
                "{} (invoked at {}) failed without an answer at {}, after the faults healed at {}",
                c.what,
                at(c.invoke_us),
                at(c.returned_us),
                at(healed_us)
            ));
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(invoke: u64, returned: u64, answered: bool) -> CallTiming {
        CallTiming {
            what: format!("call {invoke}"),
            invoke_us: invoke,
            returned_us: returned,
            answered,
        }
    }

    #[test]
    fn calls_after_the_heal_are_bounded_and_answered() {
        let bound = Duration::from_secs(1);
        // Before the heal (at 10 s) anything goes; after it, within a second and answered.
        let calls = [
            call(0, 9_000_000, false),
            call(5_000_000, 10_900_000, true),
            call(10_500_000, 11_000_000, true),
        ];
        let r = check(&calls, 10_000_000, 20_000_000, bound);
        assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
        assert_eq!(r.longest, Duration::from_millis(900));

        // Too slow, counted from the heal for a call made before it.
        let r = check(
            &[call(5_000_000, 11_500_000, true)],
            10_000_000,
            20_000_000,
            bound,
        );
        assert_eq!(r.anomalies.len(), 1, "{:?}", r.anomalies);
        // Failed without an answer after the heal.
        let r = check(
            &[call(10_100_000, 10_200_000, false)],
            10_000_000,
            20_000_000,
            bound,
        );
        assert_eq!(r.anomalies.len(), 1, "{:?}", r.anomalies);
        // Still running when the clients stopped, long after the heal.
        let r = check(
            &[call(10_100_000, u64::MAX, false)],
            10_000_000,
            12_000_000,
            bound,
        );
        assert_eq!(r.anomalies.len(), 1, "{:?}", r.anomalies);
        // Made just before the stop: not late.
        let r = check(
            &[call(11_900_000, u64::MAX, false)],
            10_000_000,
            12_000_000,
            bound,
        );
        assert!(r.anomalies.is_empty(), "{:?}", r.anomalies);
    }
}

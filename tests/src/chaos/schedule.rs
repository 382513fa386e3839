//! Seeded fault schedules: which fault, on whom, when, and for how long.
//!
//! A schedule is a pure function of its seed, so a failing run can be replayed from the seed
//! alone. Targets are named by role ("the leader", "a follower") and resolved when the fault
//! fires, because who leads depends on timing; the run's event log records who it turned out to
//! be. Faults come one at a time, each held for a while and then healed, with quiet gaps between
//! them so that the ensemble gets a chance to recover (and the checkers see both sides).

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::netproxy::Cut;

/// Whom a fault hits, resolved when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// The current leader (or any replica, when there is none).
    Leader,
    /// A replica that is not the current leader.
    Follower,
    Replica(u64),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Fault {
    /// kill -9, restarted when the fault heals.
    Kill(Target),
    /// kill -9 of every replica at once, all restarted when the fault heals.
    KillAll,
    /// SIGSTOP, SIGCONT when the fault heals.
    Pause(Target),
    /// Cut every link to and from the target.
    Isolate(Target, Cut),
    /// Cut the links from `from` to one other replica, in that direction only.
    OneWay { from: Target, to: Target, how: Cut },
    /// Restart the target gracefully (SIGTERM), as an operator would.
    Restart(Target),
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill(t) => write!(f, "kill -9 {t:?}"),
            Fault::KillAll => write!(f, "kill -9 all replicas"),
            Fault::Pause(t) => write!(f, "SIGSTOP {t:?}"),
            Fault::Isolate(t, how) => write!(f, "isolate {t:?} ({how:?})"),
            Fault::OneWay { from, to, how } => write!(f, "cut {from:?} -> {to:?} ({how:?})"),
            Fault::Restart(t) => write!(f, "SIGTERM and restart {t:?}"),
        }
    }
}

/// One fault: it fires `at` (since the run started) and heals `hold` later.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Step {
    pub at: Duration,
    pub hold: Duration,
    pub fault: Fault,
}

/// The faults of a run of `length`, from `seed`. The first fault waits for the workload to warm
/// up; the last one heals a few seconds before the end.
pub fn generate(seed: u64, length: Duration) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut steps = Vec::new();
    let mut at = Duration::from_millis(rng.gen_range(500..1500));
    let end = length.saturating_sub(Duration::from_secs(2));
    loop {
        let fault = random_fault(&mut rng);
        let hold = Duration::from_millis(match fault {
            // Long enough for an election (and for clients to notice), short enough to fit
            // several faults into a run.
            Fault::Pause(_) => rng.gen_range(300..3000),
            Fault::KillAll => rng.gen_range(100..1500),
            Fault::Restart(_) => 0,
            _ => rng.gen_range(200..4000),
        });
        if at + hold >= end {
            break;
        }
        steps.push(Step { at, hold, fault });
        at += hold + Duration::from_millis(rng.gen_range(300..2500));
    }
    steps
}

fn random_target(rng: &mut StdRng) -> Target {
    match rng.gen_range(0..10) {
        // Faults aimed at the leader are the ones that matter most.
        0..=5 => Target::Leader,
        6..=7 => Target::Follower,
        _ => Target::Replica(rng.gen_range(1..=3)),
    }
}

fn random_cut(rng: &mut StdRng) -> Cut {
    if rng.gen_bool(0.5) {
        Cut::Blackhole
    } else {
        Cut::Refuse
    }
}

fn random_fault(rng: &mut StdRng) -> Fault {
    match rng.gen_range(0..100) {
        0..=24 => Fault::Kill(random_target(rng)),
        25..=29 => Fault::KillAll,
        30..=49 => Fault::Pause(random_target(rng)),
        50..=69 => Fault::Isolate(random_target(rng), random_cut(rng)),
        70..=92 => {
            // One direction only: the classic source of stale leaders and disruptive
            // candidates.
            let (from, to) = if rng.gen_bool(0.5) {
                (Target::Leader, Target::Follower)
            } else {
                (Target::Follower, Target::Leader)
            };
            Fault::OneWay {
                from,
                to,
                how: random_cut(rng),
            }
        }
        _ => Fault::Restart(random_target(rng)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_a_function_of_the_seed() {
        let a = generate(7, Duration::from_secs(60));
        let b = generate(7, Duration::from_secs(60));
        let c = generate(8, Duration::from_secs(60));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_ne!(format!("{a:?}"), format!("{c:?}"));
        assert!(a.len() >= 10, "a 60 s run has many faults: {}", a.len());
        for w in a.windows(2) {
            assert!(w[0].at + w[0].hold < w[1].at, "faults do not overlap");
        }
        let last = a.last().expect("a fault");
        assert!(last.at + last.hold < Duration::from_secs(58));
    }
}

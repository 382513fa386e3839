//! A replica's own clock: wall time less the time the replica itself was stalled.
//!
//! A leader whose runtime is overloaded (or whose process was stopped) reads heartbeats late.
//! Counting that delay as the silence of what heartbeats to it (tasks, tf.data workers and
//! clients) would declare the live ones dead by the thousand at once, and their error decisions
//! then add to the very load that caused them. The heartbeat checker, which ticks every few
//! milliseconds on every replica, sees such a stall as its own tick waking late; what passes
//! [`STALL_SLACK`] is left out of this clock. Whatever measures silence stamps and judges on it
//! ([`StallClock::now`]): a truly dead peer is still found, later by the stall.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How late a tick may wake before the lateness counts as this replica's own stall: more than a
/// busy runtime's usual delay, well under any heartbeat timeout.
pub const STALL_SLACK: Duration = Duration::from_millis(100);

/// A stall this long is logged (shorter ones only add to the metric).
const STALL_LOGGED: Duration = Duration::from_secs(1);

/// The replica's clock, shared by everything that measures silence on it.
#[derive(Default)]
pub struct StallClock {
    /// Every stall so far, in microseconds.
    stalled_micros: AtomicU64,
}

impl StallClock {
    /// How long this replica has been stalled in all (`coord_replica_stalled_seconds_total`).
    pub fn stalled(&self) -> Duration {
        Duration::from_micros(self.stalled_micros.load(Ordering::Relaxed))
    }

    /// The clock at wall-clock instant `wall`: `wall` less every stall so far.
    pub fn at(&self, wall: Instant) -> Instant {
        wall.checked_sub(self.stalled()).unwrap_or(wall)
    }

    /// The clock now.
    pub fn now(&self) -> Instant {
        self.at(Instant::now())
    }

    /// A tick that should have woken at once woke `late`: what passes [`STALL_SLACK`] was this
    /// replica's own stall.
    pub fn woke_late(&self, late: Duration) {
        let Some(stall) = late.checked_sub(STALL_SLACK) else {
            return;
        };
        let micros = u64::try_from(stall.as_micros()).unwrap_or(u64::MAX);
        self.stalled_micros.fetch_add(micros, Ordering::Relaxed);
        if stall >= STALL_LOGGED {
            tracing::warn!(
                stall_ms = stall.as_millis() as u64,
                "this replica was stalled (its heartbeat checker woke late); that time is not counted as the heartbeat silence of any task, tf.data worker or client"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stall_is_left_out_of_a_silence_it_falls_in() {
        let clock = StallClock::default();
        let t0 = Instant::now();
        let heard = clock.at(t0);
        // Lateness within the slack is a busy runtime's, not a stall.
        clock.woke_late(STALL_SLACK);
        assert_eq!(clock.stalled(), Duration::ZERO);
        clock.woke_late(Duration::from_secs(5) + STALL_SLACK);
        clock.woke_late(Duration::from_millis(250) + STALL_SLACK);
        assert_eq!(clock.stalled(), Duration::from_millis(5250));
        let judged = clock.at(t0 + Duration::from_secs(10));
        assert_eq!(
            judged.saturating_duration_since(heard),
            Duration::from_millis(4750),
            "10 s of wall time, 4.75 of silence"
        );
    }
}

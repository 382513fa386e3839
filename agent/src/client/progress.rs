//! When each replica last answered one of this client's writes.
//!
//! A call that does not answer within the attempt timeout is sent to the next replica, because a
//! replica behind a one-way partition accepts calls it cannot complete. But a proxy in front of
//! a large job sends bursts: 12,500 torch ranks' ADDs at once through one coord-proxy, 100,000
//! through eight. On the leader they wait their turn for longer than the attempt timeout, and
//! re-sending each to a follower (which forwards it back to the same leader) only lengthens the
//! queue: the run collapsed, every ADD re-sent until it failed UNAVAILABLE after two minutes. A
//! replica that has just committed a write of this client's is serving, not cut off, so an
//! attempt there goes on waiting; one that commits nothing for an attempt timeout is given up on,
//! as before, at most one attempt timeout later than it would have been.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::{Duration, Instant};

pub(super) struct Progress {
    /// What the stamps count from.
    epoch: Instant,
    /// Per replica, milliseconds from `epoch` to its last answered write, plus one (0: never).
    committed: Vec<AtomicU64>,
}

impl Progress {
    pub(super) fn new(replicas: usize) -> Self {
        Self {
            epoch: Instant::now(),
            committed: (0..replicas).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.epoch).as_millis() as u64 + 1
    }

    /// Replica `replica` answered a write (a call with a request id) at `at`.
    pub(super) fn committed(&self, replica: usize, at: Instant) {
        if let Some(c) = self.committed.get(replica) {
            c.fetch_max(self.stamp(at), Ordering::Relaxed);
        }
    }

    /// Whether replica `replica` answered a write in the `window` before `now`.
    pub(super) fn committed_within(&self, replica: usize, window: Duration, now: Instant) -> bool {
        let Some(c) = self.committed.get(replica) else {
            return false;
        };
        let last = c.load(Ordering::Relaxed);
        let since = now.checked_sub(window).map_or(0, |t| self.stamp(t));
        last != 0 && last >= since
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_counts_for_one_window() {
        let p = Progress::new(2);
        let window = Duration::from_secs(2);
        let t0 = p.epoch + Duration::from_secs(10);
        let after = |ms| t0 + Duration::from_millis(ms);
        assert!(!p.committed_within(0, window, t0), "nothing answered yet");
        p.committed(0, t0);
        assert!(p.committed_within(0, window, t0));
        assert!(
            !p.committed_within(1, window, t0),
            "the other replica answered nothing"
        );
        assert!(p.committed_within(0, window, after(1900)));
        assert!(
            !p.committed_within(0, window, after(2100)),
            "2.1 s since its last write"
        );
        p.committed(0, after(500));
        p.committed(0, after(100));
        assert!(
            p.committed_within(0, window, after(2400)),
            "the latest write counts"
        );
        assert!(!p.committed_within(7, window, t0), "no such replica");
    }
}

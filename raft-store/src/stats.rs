//! Lock-free counters and latency histograms, read by the server's `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) of the histogram buckets, Prometheus style; the last bucket is +Inf.
pub const LATENCY_BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// A fixed-bucket latency histogram that many threads record into without locks.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

/// A consistent-enough copy of a [`Histogram`] for rendering.
#[derive(Debug, Clone, Default)]
pub struct HistogramSnapshot {
    /// Non-cumulative counts per bucket; the last is the +Inf bucket.
    pub buckets: Vec<u64>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.count.fetch_add(1, Relaxed);
        self.sum_nanos
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self.buckets.iter().map(|b| b.load(Relaxed)).collect(),
            count: self.count.load(Relaxed),
            sum_seconds: self.sum_nanos.load(Relaxed) as f64 / 1e9,
        }
    }
}

/// What the log store's flusher has done: how many syncs, how many writes they covered, how long
/// they took. `jobs / syncs` is the group-commit factor.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Writes handed to the flusher; `submitted - jobs` is the queue depth.
    pub submitted: AtomicU64,
    pub syncs: AtomicU64,
    /// Writes whose sync completed (or failed).
    pub jobs: AtomicU64,
    pub latency: Histogram,
    /// Lone writes this replica, leading, sent to followers before its sync (`pre_append`).
    pub pre_appends_sent: AtomicU64,
    /// Pre-appends this replica, following, wrote; and those it did not take (another leader's,
    /// or not extending its log).
    pub pre_appends_written: AtomicU64,
    pub pre_appends_passed: AtomicU64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_into_the_right_bucket() {
        let h = Histogram::default();
        h.record(Duration::from_micros(30));
        h.record(Duration::from_millis(3));
        h.record(Duration::from_secs(100));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], 1);
        assert_eq!(s.buckets[6], 1);
        assert_eq!(s.buckets[LATENCY_BUCKETS.len()], 1);
    }
}

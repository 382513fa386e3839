//! Each namespace's write rate, held on the leader before a write is proposed: a token bucket per
//! namespace (its `writes_per_sec`, `write_burst` deep), so a namespace writing as fast as it can
//! is held to its rate and the log, the fsyncs and the apply stay there for the others. A write
//! past the rate fails RESOURCE_EXHAUSTED naming the namespace and the limit; it changed nothing
//! and may be sent again.
//!
//! Leader memory: a new leader starts every bucket full.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use crate::error::CoordError;

struct Bucket {
    tokens: f64,
    refilled: Instant,
}

#[derive(Default)]
pub struct WriteRates {
    buckets: Mutex<HashMap<Arc<str>, Bucket>>,
}

impl WriteRates {
    /// Takes one write of namespace `name` from its bucket: `per_sec` sustained (0: no limit),
    /// `burst` at once (0: one second's worth).
    pub fn take(&self, name: &Arc<str>, per_sec: u64, burst: u64) -> Result<(), CoordError> {
        if per_sec == 0 {
            return Ok(());
        }
        let depth = if burst == 0 { per_sec } else { burst } as f64;
        let now = Instant::now();
        let mut all = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let b = all.entry(name.clone()).or_insert(Bucket {
            tokens: depth,
            refilled: now,
        });
        let elapsed = now.saturating_duration_since(b.refilled).as_secs_f64();
        b.tokens = (b.tokens + elapsed * per_sec as f64).min(depth);
        b.refilled = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(CoordError::ResourceExhausted(format!(
            "namespace {name:?} writes faster than its limit of {per_sec} writes a second (writes_per_sec, burst {}); the write was refused before it entered the log, retry later",
            depth as u64
        )))
    }

    /// Forgets the buckets of namespaces `keep` does not keep.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.buckets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|name, _| keep(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_is_held_to_its_rate_and_the_others_are_not() {
        let rates = WriteRates::default();
        let noisy: Arc<str> = Arc::from("noisy");
        let quiet: Arc<str> = Arc::from("quiet");
        let passed = (0..100)
            .filter(|_| rates.take(&noisy, 10, 5).is_ok())
            .count();
        assert!((5..=6).contains(&passed), "{passed} of 100 at once");
        let refused = rates.take(&noisy, 10, 5).expect_err("past the burst");
        assert!(refused.to_string().contains("\"noisy\""), "{refused}");
        assert!(
            rates.take(&quiet, 10, 5).is_ok(),
            "another namespace has its own bucket"
        );
        assert!(rates.take(&noisy, 0, 0).is_ok(), "no limit");
    }
}

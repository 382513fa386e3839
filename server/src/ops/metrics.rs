//! Prometheus metrics: RPC counts and latencies recorded by routing, plus gauges and histograms
//! read from the Raft node, the proposer, the read index and the log flusher when `/metrics` is
//! scraped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use coord_raft_store::stats::{Histogram, HistogramSnapshot, LATENCY_BUCKETS};
use tonic::Code;

#[derive(Default)]
pub struct Metrics {
    /// Series are created on first use and then only read, hence the `RwLock`.
    rpcs: RwLock<BTreeMap<(&'static str, i32), Arc<Histogram>>>,
    pub leader_changes: AtomicU64,
}

impl Metrics {
    pub fn record_rpc(&self, method: &'static str, code: Code, elapsed: Duration) {
        let key = (method, code as i32);
        let existing = self
            .rpcs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        let h = existing.unwrap_or_else(|| {
            self.rpcs
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(key)
                .or_default()
                .clone()
        });
        h.record(elapsed);
    }

    pub fn render_rpcs(&self, out: &mut String) {
        let rpcs: Vec<_> = self
            .rpcs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, v)| (*k, v.snapshot()))
            .collect();
        header(
            out,
            "coord_rpc_duration_seconds",
            "histogram",
            "Client RPCs by method and gRPC status code.",
        );
        for ((method, code), snap) in rpcs {
            let labels = format!(
                "method=\"{method}\",code=\"{}\"",
                grpc_code_name(Code::from(code))
            );
            histogram(out, "coord_rpc_duration_seconds", &labels, &snap);
        }
        counter(
            out,
            "coord_raft_leader_changes_total",
            "Leader changes this replica observed.",
            self.leader_changes.load(Relaxed),
        );
    }
}

/// A status code as gRPC names it (`OK`, `UNAVAILABLE`), as Prometheus exporters of gRPC
/// servers label it; not tonic's Rust names (`Ok`, `Unavailable`).
pub use coord_proto::grpc_code_name;

pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

pub fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    header(out, name, "gauge", help);
    let _ = writeln!(out, "{name} {value}");
}

pub fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    header(out, name, "counter", help);
    let _ = writeln!(out, "{name} {value}");
}

/// A counter of a fractional quantity (seconds of CPU).
pub fn counter_f64(out: &mut String, name: &str, help: &str, value: f64) {
    header(out, name, "counter", help);
    let _ = writeln!(out, "{name} {value}");
}

/// Writes one histogram series (without its header).
pub fn histogram(out: &mut String, name: &str, labels: &str, h: &HistogramSnapshot) {
    let sep = if labels.is_empty() { "" } else { "," };
    let mut cumulative = 0;
    for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
        cumulative += h.buckets.get(i).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
        );
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_seconds);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
}

/// A whole histogram metric with one unlabeled series.
pub fn single_histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    header(out, name, "histogram", help);
    histogram(out, name, "", &h.snapshot());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_cumulative_buckets() {
        let m = Metrics::default();
        m.record_rpc("GetKeyValue", Code::Ok, Duration::from_micros(40));
        m.record_rpc("GetKeyValue", Code::Ok, Duration::from_millis(20));
        let mut out = String::new();
        m.render_rpcs(&mut out);
        assert!(out.contains("coord_rpc_duration_seconds_bucket{method=\"GetKeyValue\",code=\"OK\",le=\"0.00005\"} 1"));
        assert!(out.contains(
            "coord_rpc_duration_seconds_bucket{method=\"GetKeyValue\",code=\"OK\",le=\"+Inf\"} 2"
        ));
        assert!(
            out.contains("coord_rpc_duration_seconds_count{method=\"GetKeyValue\",code=\"OK\"} 2")
        );
    }

    #[test]
    fn codes_carry_grpc_names() {
        assert_eq!(grpc_code_name(Code::Ok), "OK");
        assert_eq!(
            grpc_code_name(Code::ResourceExhausted),
            "RESOURCE_EXHAUSTED"
        );
        // Every code's name is the upper-snake form of tonic's.
        for n in 0..=16 {
            let code = Code::from(n);
            let rust = format!("{code:?}");
            let mut snake = String::new();
            for (i, c) in rust.chars().enumerate() {
                if c.is_uppercase() && i > 0 {
                    snake.push('_');
                }
                snake.push(c.to_ascii_uppercase());
            }
            assert_eq!(grpc_code_name(code), snake);
        }
    }
}

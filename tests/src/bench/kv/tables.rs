//! The results of the rounds, and the tables of `--tls` and `--sled`: each workload's runs by
//! system ([`Compared`]), their medians, and the ratios the tables show.

use std::time::Duration;

use super::plan::{Args, Workload, COORD, ETCD, ETCD_TLS, SLED, TLS, TLS_PLAIN_TARGET};
use crate::bench::load::LoadResult;

/// One workload's result on every system: each round's run, by system label.
pub(super) struct Compared(pub(super) Vec<(&'static str, Vec<LoadResult>)>);

impl Compared {
    /// `label`'s runs; none when that system was not measured.
    pub(super) fn of(&self, label: &str) -> &[LoadResult] {
        self.0
            .iter()
            .find(|(l, _)| *l == label)
            .map_or(&[], |(_, runs)| runs.as_slice())
    }
}

pub(super) fn median_by<F: Fn(&LoadResult) -> f64>(runs: &[LoadResult], f: F) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(f).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub(super) fn ops(runs: &[LoadResult]) -> f64 {
    median_by(runs, LoadResult::ops_per_sec)
}

/// The median of a latency over `runs`, in ms.
pub(super) fn ms(runs: &[LoadResult], f: fn(&LoadResult) -> Duration) -> String {
    fmt_ms(Duration::from_secs_f64(median_by(runs, |x| {
        f(x).as_secs_f64()
    })))
}

/// `a/b` of the median throughputs, or "-" when either was not measured.
pub(super) fn ratio(a: &[LoadResult], b: &[LoadResult]) -> String {
    if a.is_empty() || b.is_empty() {
        return "-".into();
    }
    format!("{:.2}x", ops(a) / ops(b).max(1e-9))
}

/// The median throughput, or "-" when not measured.
pub(super) fn ops_cell(runs: &[LoadResult]) -> String {
    if runs.is_empty() {
        return "-".into();
    }
    format!("{:.0}", ops(runs))
}

pub(super) fn fmt_ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// The second table of `--tls`: the TLS ensemble against the plain one, same rounds.
pub(super) fn print_tls(args: &Args, wls: &[Workload], results: &[Compared]) {
    println!(
        "\n| workload (median of {} rounds) | coord ops/s | coord p50 ms | coord over TLS ops/s | TLS p50 ms | TLS p99 ms | TLS/plain |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(results) {
        let (coord, tls) = (r.of(COORD), r.of(TLS));
        println!(
            "| {} | {:.0} | {} | {:.0} | {} | {} | {} |",
            w.name,
            ops(coord),
            ms(coord, |x| x.p50),
            ops(tls),
            ms(tls, |x| x.p50),
            ms(tls, |x| x.p99),
            ratio(tls, coord)
        );
    }
}

/// The third table of `--tls`: coord over TLS against etcd over TLS and against coord over plain
/// gRPC, same rounds, each against issue 26's target. Ratios are of the medians' throughputs, as
/// in the other tables.
pub(super) fn print_tls_vs_etcd(args: &Args, wls: &[Workload], results: &[Compared]) {
    println!(
        "\n| workload (median of {} rounds) | coord TLS ops/s | etcd TLS ops/s | coord TLS/etcd TLS | target | coord TLS/plain | target |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(results) {
        let (coord, tls, etcd_tls) = (r.of(COORD), r.of(TLS), r.of(ETCD_TLS));
        println!(
            "| {} | {:.0} | {} | {} | >= {}x | {} | >= {}x |",
            w.name,
            ops(tls),
            ops_cell(etcd_tls),
            ratio(tls, etcd_tls),
            w.tls_target_ratio,
            ratio(tls, coord),
            TLS_PLAIN_TARGET
        );
    }
}

/// The table of `--sled`: the ensemble on the sled log against the one on the segment log and
/// against etcd, same rounds.
pub(super) fn print_sled(args: &Args, wls: &[Workload], results: &[Compared]) {
    println!(
        "\n| workload (median of {} rounds) | segments ops/s | sled ops/s | etcd ops/s | sled/segments | sled/etcd | segments p50 ms | sled p50 ms | sled p99 ms |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (w, r) in wls.iter().zip(results) {
        let (segments, sled, etcd) = (r.of(COORD), r.of(SLED), r.of(ETCD));
        println!(
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |",
            w.name,
            ops(segments),
            ops(sled),
            ops_cell(etcd),
            ratio(sled, segments),
            ratio(sled, etcd),
            ms(segments, |x| x.p50),
            ms(sled, |x| x.p50),
            ms(sled, |x| x.p99)
        );
    }
}

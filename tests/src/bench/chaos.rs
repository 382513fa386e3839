//! `coord-bench chaos`: seeded fault-injection runs (`crate::chaos::runner`) one after another,
//! each printed as it ends, and a summary of them all. Run i uses seed `seed + i`, so a failed
//! run is replayed by passing its seed.

use std::time::Duration;

use crate::chaos::recovery;
use crate::chaos::runner::{self, RunOptions};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Runs; run i uses seed `seed + i`.
    #[arg(long, default_value_t = 1)]
    pub runs: u64,
    /// Length of each run.
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    /// The first run's seed (a failed run prints its seed; pass it here to replay it).
    #[arg(long, default_value_t = 1000)]
    pub seed: u64,
    /// Keep going after a run with anomalies.
    #[arg(long)]
    pub keep_going: bool,
    /// The ensemble serves TLS (peers, Raft links and clients).
    #[arg(long)]
    pub tls: bool,
}

/// Runs the chaos schedules one after another; true when every run was clean.
pub async fn run(args: Args) -> bool {
    let started = std::time::Instant::now();
    let (mut clean, mut ops, mut unknown, mut faults) = (0u64, 0usize, 0usize, 0usize);
    let mut raw_ops = 0;
    let mut failed = Vec::new();
    let mut longest = Duration::ZERO;
    for i in 0..args.runs {
        let seed = args.seed + i;
        let options = RunOptions {
            tls: args.tls,
            ..RunOptions::new(seed, Duration::from_secs(args.seconds))
        };
        let report = runner::run(&options).await;
        println!("run {}/{}: {}", i + 1, args.runs, report.summary());
        for a in &report.anomalies {
            println!("  anomaly: {a}");
        }
        ops += report.kv_ops;
        raw_ops += report.raw_ops;
        unknown += report.kv_unknown;
        longest = longest.max(report.longest_after_heal);
        faults += report.faults;
        if report.anomalies.is_empty() {
            clean += 1;
        } else {
            failed.push(seed);
            if !args.keep_going {
                break;
            }
        }
    }
    println!(
        "chaos: {clean} clean runs of {} s, {} with anomalies (seeds {failed:?}); {faults} faults, {ops} kv operations checked ({unknown} unknown), {raw_ops} other raw-key operations; longest call after a run's last heal {:.3} s (bound {:.1} s); {:.0} s",
        args.seconds,
        failed.len(),
        longest.as_secs_f64(),
        recovery::BOUND.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    failed.is_empty()
}

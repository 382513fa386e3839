//! `coord-bench crash`: the crash-consistency loop (`crate::chaos::crash`) with its knobs, and
//! its report.

use crate::chaos::crash::{crash_loop, CrashOptions};

#[derive(clap::Args, Clone)]
pub struct Args {
    #[arg(long, default_value_t = 500)]
    pub cycles: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Clients writing during each cycle.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// The share of cycles that kill all three replicas (the rest kill one at random).
    #[arg(long, default_value_t = 0.3)]
    pub kill_all_ratio: f64,
    /// The ensemble serves TLS (peers, Raft links and clients).
    #[arg(long)]
    pub tls: bool,
}

/// Runs the crash-consistency loop; true when it found nothing.
pub async fn run(args: Args) -> bool {
    let started = std::time::Instant::now();
    let report = crash_loop(&CrashOptions {
        cycles: args.cycles,
        seed: args.seed,
        clients: args.clients,
        kill_all_ratio: args.kill_all_ratio,
        tls: args.tls,
    })
    .await;
    println!(
        "crash: {} ({:.0} s)",
        report.summary(),
        started.elapsed().as_secs_f64()
    );
    for a in &report.anomalies {
        println!("  anomaly: {a}");
    }
    report.anomalies.is_empty()
}

//! `coord-bench failover`: agents under steady load while the leader is killed again and again;
//! the longest stall an agent call sees, per kill and over all kills, and the agents that did not
//! recover.

use std::sync::Arc;
use std::time::Duration;

use super::agent_target::AgentTarget;
use super::coord_target::CoordEnsemble;
use super::failover;
use super::failover_report::print_gaps;
use crate::{Cluster, ClusterOptions};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Leader kills.
    #[arg(long, default_value_t = 20)]
    pub kills: usize,
    /// Agents writing in closed loops.
    #[arg(long, default_value_t = 16)]
    pub agents: usize,
}

/// Runs the `coord-bench failover` benchmark on a fresh ensemble and prints its table.
pub async fn run(args: Args) -> Result<(), String> {
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: vec!["--worker-threads".into(), "1".into()],
        log_filter: "warn".into(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    eprintln!(
        "coord-bench failover: {} agents, {} leader kills",
        args.agents, args.kills
    );
    let target = Arc::new(AgentTarget::new(cluster.endpoints(), args.agents)?);
    let gaps = failover::measure(
        target,
        &mut CoordEnsemble::new(&mut cluster),
        args.agents,
        args.kills,
    )
    .await;
    print_gaps("coord", &gaps);
    let mut sorted: Vec<Duration> = gaps.iter().map(|g| g.worst_gap).collect();
    sorted.sort_unstable();
    let max = sorted.last().copied().unwrap_or_default();
    let stuck: usize = gaps.iter().map(|g| g.stuck_clients).sum();
    println!(
        "\n| leader kills under agent load ({} agents) | value | target |",
        args.agents
    );
    println!("|---|---:|---:|");
    println!("| kills | {} | |", gaps.len());
    println!(
        "| longest stall an agent call saw, median over kills | {} ms | <= 500 ms |",
        failover::median(&gaps).as_millis()
    );
    println!(
        "| longest stall an agent call saw, worst kill | {} ms | <= 1500 ms |",
        max.as_millis()
    );
    println!("| agents that did not recover within 30 s | {stuck} | 0 |");
    Ok(())
}

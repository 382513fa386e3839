//! coord-bench: benchmarks of coord against its anchors, in one run, on this machine.
//!
//! `coord-bench kv` starts a 3-replica coord ensemble and a 3-member etcd 3.4 cluster (one after
//! the other, real processes on loopback), drives both with the same closed-loop clients, and
//! prints throughput, latency percentiles and coord/etcd ratios, then kills each one's leader under
//! write load and reports the longest write gap a client saw.
//!
//! Build it in release mode: `cargo run --release -p coord-tests --bin coord-bench -- kv`.
//!
//! This binary is only the command line: each subcommand runs a module of `coord_tests::bench`
//! (`kv`, `agent_failover`, `tasks`, `chaos`, `crash`, `dispatcher`, `rendezvous`, `rolling`,
//! `tfdata`, `torch`, `namespaces`, `xla_scale`).

/// The clients of both systems allocate a lot per call; glibc's malloc took a fifth of the
/// benchmark process's CPU, which the servers on this shared machine then lacked.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use coord_tests::bench::{
    agent_failover, chaos, crash, dispatcher, kv, namespaces, rendezvous, rolling, scale, tfdata,
    torch, wait_for_all, xla_scale,
};

#[derive(Parser)]
#[command(
    name = "coord-bench",
    about = "Benchmarks of coord against its anchors"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Key-value put/get throughput and leader-kill write gap, coord vs etcd 3.4.
    Kv(kv::Args),
    /// Agents under steady load while the leader is killed again and again: the longest stall an
    /// agent call sees.
    Failover(agent_failover::Args),
    /// Rolling restarts of the whole ensemble under agent load, SIGTERM (leader handoff) against
    /// kill -9: the longest stall an agent call sees.
    Rolling(rolling::Args),
    /// Many simulated tasks heartbeating once a second: register, WaitForAllTasks, one barrier
    /// across all, a leader kill; leader CPU and memory.
    Tasks(scale::Args),
    /// `tasks` for several job sizes (10k, 30k, 100k), heartbeats at TensorFlow's interval.
    Scale(scale::ScaleArgs),
    /// A whole job's WaitForAllTasks (2,000 and 10,000 tasks) on coord against TensorFlow's own
    /// coordination service, hosted by a TensorFlow process.
    WaitForAll(wait_for_all::Args),
    /// A large JAX job on jaxlib's XLA wire (2,000 and 10,000 tasks): the register-barrier storm,
    /// heartbeat CPU, a whole-job GetAliveTasks, and the Raft log each phase writes.
    XlaScale(xla_scale::Args),
    /// Seeded fault-injection runs (crashes, pauses, partitions) checked for linearizability,
    /// barrier safety, lost writes and the task incarnation rules.
    Chaos(chaos::Args),
    /// The crash-consistency loop: load, kill -9 one or all replicas, restart, verify.
    Crash(crash::Args),
    /// The replicated tf.data dispatcher against TensorFlow's own: GetSplit throughput under
    /// DYNAMIC sharding and restore time after a full restart.
    Dispatcher(DispatcherArgs),
    /// Rendezvous tensors worker → worker over the direct links, against iperf3 on loopback;
    /// peer-death detection time.
    Rendezvous(rendezvous::Args),
    /// coord's tf.data dispatcher against TensorFlow's own, with TF's own workers and reader:
    /// DYNAMIC-sharding elements/s end to end, and the split gap when the dispatcher is killed.
    Tfdata(tfdata::Args),
    /// torch's TCPStore through coord-proxy against torch's own store: call latency,
    /// init_process_group's store traffic for thousands of ranks, torchrun's start to its first
    /// step, and the stall a torch client sees across a leader kill.
    Torch(torch::Args),
    /// A share of `torch`'s simulated ranks, run in a child process of it (see
    /// `coord_tests::bench::torch::ranks`).
    #[command(hide = true)]
    TorchRanks(torch::ranks::ChildArgs),
    /// Many jobs on one ensemble, each in its own namespace, beside a noisy namespace writing as
    /// fast as it can: the quiet jobs' barrier p99 with and without it, the noisy one's rate,
    /// the state an empty namespace takes.
    Namespaces(namespaces::Args),
}

#[derive(clap::Args, Clone)]
struct DispatcherArgs {
    /// Worker counts to measure (comma separated; 0 skips the throughput runs).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 16])]
    workers: Vec<usize>,
    /// Splits (one element each) per throughput run.
    #[arg(long, default_value_t = 50_000)]
    splits: u64,
    /// Journal sizes to restore from (comma separated; 0 skips the restore runs).
    #[arg(long, value_delimiter = ',', default_values_t = [200_000, 1_000_000])]
    restore_updates: Vec<u64>,
    /// Measure coord only (no TensorFlow venv).
    #[arg(long)]
    no_tf: bool,
    /// Skip the end-to-end runs with data-worker processes.
    #[arg(long)]
    no_e2e: bool,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Kv(args) => {
            if let Err(e) = kv::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Failover(args) => {
            if let Err(e) = agent_failover::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Rolling(args) => {
            if let Err(e) = rolling::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Tasks(args) => {
            if let Err(e) = scale::tasks(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Scale(args) => {
            if let Err(e) = scale::scale(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::WaitForAll(args) => {
            if let Err(e) = wait_for_all::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::XlaScale(args) => {
            if let Err(e) = xla_scale::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Chaos(args) => {
            if !chaos::run(args).await {
                std::process::exit(1);
            }
        }
        Cmd::Dispatcher(a) => {
            let args = dispatcher::Args {
                workers: a.workers,
                splits: a.splits,
                restore_updates: a.restore_updates,
                no_tf: a.no_tf,
                no_e2e: a.no_e2e,
            };
            if let Err(e) = dispatcher::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Rendezvous(args) => {
            if let Err(e) = rendezvous::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Torch(args) => {
            if let Err(e) = torch::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::TorchRanks(args) => {
            if let Err(e) = torch::ranks::child(args).await {
                eprintln!("coord-bench torch-ranks: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Tfdata(args) => {
            if let Err(e) = tfdata::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Namespaces(args) => {
            if let Err(e) = namespaces::run(args).await {
                eprintln!("coord-bench: {e}");
                std::process::exit(1);
            }
        }
        Cmd::Crash(args) => {
            if !crash::run(args).await {
                std::process::exit(1);
            }
        }
    }
}

//! coord-demo: a training job that survives the preemption of its chief.
//!
//! `coord-demo train` starts a 3-replica coord ensemble and a few task processes running a step
//! loop, preempts the chief (SIGTERM) and kills the coordinator leader as the chief exits, restarts
//! both, and prints the timeline: who got the notice, the agreed sync step, the failover, the
//! restart, the resume. `--scenario` plays the other cases (a notice during an election, two
//! tasks preempted at once, a task that dies before the barrier).
//!
//! `coord-demo task` is one task of the job (the supervisor starts them).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use coord_tools::demo::task::{self, TaskArgs};
use coord_tools::demo::{run_job, JobOptions, Scenario, JOB};

#[derive(Parser)]
#[command(
    name = "coord-demo",
    about = "A training job that survives the preemption of its chief"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a whole job: ensemble, tasks, and a preemption scenario.
    Train {
        #[arg(long, default_value_t = 3)]
        tasks: usize,
        #[arg(long, default_value_t = 80)]
        steps: i64,
        #[arg(long, default_value_t = 100)]
        step_ms: u64,
        /// Time from SIGTERM to the preempted task's death.
        #[arg(long, default_value_t = 20_000)]
        grace_ms: u64,
        #[arg(long, value_enum, default_value_t = Scenario::Chief)]
        scenario: Scenario,
    },
    /// One task of the job.
    Task {
        #[arg(long, value_delimiter = ',')]
        endpoints: Vec<String>,
        #[arg(long)]
        task_id: i32,
        #[arg(long)]
        steps: i64,
        #[arg(long)]
        step_ms: u64,
        #[arg(long)]
        grace_ms: u64,
        #[arg(long)]
        checkpoint_dir: PathBuf,
        #[arg(long)]
        epoch_ms: u64,
    },
}

#[tokio::main]
async fn main() {
    tracing_init();
    match Cli::parse().command {
        Cmd::Train {
            tasks,
            steps,
            step_ms,
            grace_ms,
            scenario,
        } => {
            let binary = std::env::current_exe().expect("the coord-demo executable");
            let outcome = run_job(
                &binary,
                JobOptions {
                    tasks,
                    steps,
                    step_time: Duration::from_millis(step_ms),
                    grace: Duration::from_millis(grace_ms),
                    scenario,
                    echo: true,
                },
            )
            .await;
            let done = outcome
                .lines
                .iter()
                .filter(|l| l.contains("done at step"))
                .count();
            println!(
                "\n{done} of {tasks} tasks finished the job; task exits: {:?}",
                outcome.exits
            );
            if done < tasks && scenario != Scenario::Dies {
                std::process::exit(1);
            }
        }
        Cmd::Task {
            endpoints,
            task_id,
            steps,
            step_ms,
            grace_ms,
            checkpoint_dir,
            epoch_ms,
        } => {
            let code = task::run(TaskArgs {
                endpoints,
                job: JOB.to_string(),
                task_id,
                steps,
                step_time: Duration::from_millis(step_ms),
                grace: Duration::from_millis(grace_ms),
                checkpoint_dir,
                epoch_ms,
            })
            .await;
            std::process::exit(code);
        }
    }
}

fn tracing_init() {
    // Library logs (the agent's) go to stderr; the timeline goes to stdout.
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

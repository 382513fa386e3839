//! `coordctl dispatcher jobs|workers|journal`: the tf.data dispatcher's state, as the leader has
//! it.

use std::process::ExitCode;

use clap::Subcommand;
use coord_agent::data::DispatchClient;
use coord_agent::CoordClient;
use coord_proto::coord::dispatcher as pb;
use serde_json::{json, Value};
use tonic::Status;

use super::output::{Output, Table};

#[derive(Subcommand)]
pub enum DispatcherCmd {
    /// Every job: mode, clients, tasks, split position (DYNAMIC), finished; and every iteration
    /// of TensorFlow's tf.data service (SERVICE tensorflow: one row per job repetition).
    Jobs,
    /// Every data worker (coord's and TensorFlow's): alive, tasks, time since its last heartbeat
    /// (leader memory).
    Workers,
    /// The journal: one line per dispatcher update in the Raft log (compacted entries are in the
    /// snapshot and no longer listed).
    Journal {
        /// First log index to print (default: the oldest kept).
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// At most this many updates.
        #[arg(long, default_value_t = 1000)]
        limit: u64,
    },
}

fn mode(m: i32) -> &'static str {
    pb::ProcessingMode::try_from(m).map_or("?", |m| m.as_str_name())
}

pub async fn run(
    client: &CoordClient,
    cmd: DispatcherCmd,
    out: Output,
) -> Result<ExitCode, Status> {
    let d = DispatchClient::new(client.clone());
    match cmd {
        DispatcherCmd::Jobs => {
            let reply = d.list_jobs(pb::ListJobsRequest {}).await?;
            let mut t = Table::new(&[
                "SERVICE",
                "JOB",
                "NAME",
                "DATASET",
                "MODE",
                "ITERATION",
                "REPETITION",
                "CONSUMERS",
                "CLIENTS",
                "TASKS",
                "PENDING",
                "SPLITS",
                "LEASED",
                "REISSUED",
                "FINISHED",
            ]);
            for j in reply.jobs {
                let splits = if j.mode == pb::ProcessingMode::Dynamic as i32 {
                    json!(if j.total_splits == 0 {
                        format!("{}/inf", j.next_split)
                    } else {
                        format!("{}/{}", j.next_split, j.total_splits)
                    })
                } else {
                    Value::Null
                };
                t.push(vec![
                    json!("coord"),
                    json!(j.job_id),
                    j.job_name.map_or(Value::Null, |n| json!(n)),
                    json!(j.dataset_id),
                    json!(mode(j.mode)),
                    Value::Null,
                    Value::Null,
                    j.num_consumers.map_or(Value::Null, |n| json!(n)),
                    json!(j.clients),
                    json!(j.tasks),
                    json!(j.pending_tasks),
                    splits,
                    json!(j.leased_splits),
                    json!(j.reissued_splits),
                    json!(j.finished),
                ]);
            }
            for it in reply.tf_iterations {
                // Per split provider: repetition, then splits handed out of that repetition.
                let splits = if it.splits.is_empty() {
                    Value::Null
                } else {
                    json!(it
                        .splits
                        .iter()
                        .map(|p| format!("r{}:{}/{}", p.repetition, p.index, p.splits))
                        .collect::<Vec<_>>()
                        .join(","))
                };
                t.push(vec![
                    json!("tensorflow"),
                    json!(it.job_id),
                    json!(it.job_name),
                    json!(it.dataset_id),
                    json!(it.processing_mode),
                    json!(it.iteration_id),
                    json!(it.repetition),
                    it.num_consumers.map_or(Value::Null, |n| json!(n)),
                    json!(it.clients),
                    json!(it.tasks),
                    json!(it.pending_tasks),
                    splits,
                    Value::Null,
                    Value::Null,
                    json!(it.finished),
                ]);
            }
            t.print(out);
        }
        DispatcherCmd::Workers => {
            let reply = d.get_workers(pb::GetWorkersRequest {}).await?;
            let mut t = Table::new(&[
                "SERVICE",
                "ADDRESS",
                "WORKER ID",
                "ALIVE",
                "TASKS",
                "HEARTBEAT AGE MS",
            ]);
            for w in reply.workers {
                t.push(vec![
                    json!("coord"),
                    json!(w.address),
                    json!(w.worker_id),
                    json!(w.alive),
                    json!(w.tasks),
                    w.millis_since_heartbeat.map_or(Value::Null, |m| json!(m)),
                ]);
            }
            // TensorFlow never declares a worker dead; its id is its place in the configured
            // worker list, if there is one.
            for w in reply.tf_workers {
                t.push(vec![
                    json!("tensorflow"),
                    json!(w.address),
                    w.worker_index.map_or(Value::Null, |i| json!(i)),
                    Value::Null,
                    json!(w.tasks),
                    w.millis_since_heartbeat.map_or(Value::Null, |m| json!(m)),
                ]);
            }
            t.print(out);
        }
        DispatcherCmd::Journal { from, limit } => {
            let reply = d
                .journal(pb::JournalRequest {
                    from_index: from,
                    limit,
                })
                .await?;
            if out == Output::Json {
                let rows: Vec<Value> = reply
                    .entries
                    .iter()
                    .map(|e| json!({"index": e.index, "term": e.term, "proposed_at_ms": e.proposed_at_ms, "update": e.update}))
                    .collect();
                println!(
                    "{}",
                    json!({"first_index": reply.first_index, "entries": rows})
                );
            } else {
                for e in reply.entries {
                    println!("{:>8} t{:<4} {}", e.index, e.term, e.update);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

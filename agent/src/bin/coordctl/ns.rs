//! `coordctl ns`: the ensemble's namespaces (one per training job): create, list with usage
//! against limits, delete. Every other command acts in the namespace `-n` names.

use std::process::ExitCode;

use clap::Subcommand;
use coord_agent::namespace::{declaration, LimitArgs, ShapeArgs};
use coord_agent::CoordClient;
use serde_json::json;
use tonic::Status;

use crate::output::{Output, Table};

#[derive(Subcommand)]
pub enum NsCmd {
    /// Create namespace NAME with this job and limits (or confirm it exists with exactly them).
    Create {
        name: String,
        #[command(flatten)]
        shape: ShapeArgs,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Every namespace: its job, usage against its limits, parked calls.
    List,
    /// Delete namespace NAME and everything in it: keys, tasks, barriers, runs.
    Delete { name: String },
}

/// `used/limit`, or `used` when there is no limit.
fn against(used: u64, limit: u64) -> String {
    if limit == 0 {
        used.to_string()
    } else {
        format!("{used}/{limit}")
    }
}

pub async fn run(client: &CoordClient, cmd: NsCmd, out: Output) -> Result<ExitCode, Status> {
    match cmd {
        NsCmd::Create {
            name,
            shape,
            limits,
        } => {
            let req = declaration(&name, &shape, &limits).map_err(Status::invalid_argument)?;
            let reply = client.declare_namespace(req).await?;
            let mut t = Table::new(&["NAMESPACE", "CREATED"]);
            t.push(vec![json!(name), json!(reply.created)]);
            t.print(out);
        }
        NsCmd::Delete { name } => {
            client.delete_namespace(&name).await?;
            let mut t = Table::new(&["NAMESPACE", "DELETED"]);
            t.push(vec![json!(name), json!(true)]);
            t.print(out);
        }
        NsCmd::List => {
            let rows = client.list_namespaces().await?;
            let mut t = Table::new(&[
                "NAMESPACE",
                "JOBS",
                "TASKS",
                "CONNECTED",
                "KEYS",
                "BYTES",
                "PARKED",
                "WRITES/S",
            ]);
            for r in rows {
                let limits = r.limits.unwrap_or_default();
                let jobs: Vec<String> = r
                    .shape
                    .map(|s| {
                        let mut jobs: Vec<(String, u32)> = s.jobs.into_iter().collect();
                        jobs.sort();
                        jobs.into_iter().map(|(j, n)| format!("{j}={n}")).collect()
                    })
                    .unwrap_or_default();
                t.push(vec![
                    json!(r.name),
                    json!(jobs.join(",")),
                    json!(against(r.tasks, limits.max_tasks)),
                    json!(r.connected_tasks),
                    json!(against(r.keys, limits.max_keys)),
                    json!(against(r.bytes, limits.max_bytes)),
                    json!(against(r.parked, limits.max_parked)),
                    json!(limits.writes_per_sec),
                ]);
            }
            t.print(out);
        }
    }
    Ok(ExitCode::SUCCESS)
}

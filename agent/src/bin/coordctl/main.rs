//! `coordctl`: talk to a coord ensemble from a shell. Give it any or all replicas; it finds the
//! leader and follows it.
//!
//! ```text
//! coordctl --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 status
//! coordctl --endpoints http://127.0.0.1:7101,http://127.0.0.1:7102 status   # etcdctl's form
//! coordctl --endpoints https://10.0.0.1:7101 --tls-ca ca.crt status        # https needs the CA
//! coordctl kv put config/lr 0.01
//! coordctl kv put model/weights < weights.bin   # no VALUE: all of stdin, as bytes
//! coordctl kv get config/lr          # waits until the key exists
//! coordctl kv get --raw model/weights > out.bin  # the bytes exactly, no newline
//! coordctl kv ls config
//! coordctl kv watch config           # every change under config/, until interrupted
//! coordctl kv rm config
//! coordctl tasks                     # state, incarnation, age of the last heartbeat
//! coordctl barriers                  # open barriers: who arrived, who is missing, time left
//! coordctl snapshot                  # every replica snapshots now
//! coordctl snapshot save backup.bin  # a backup, for coordinator --restore backup.bin
//! coordctl member list
//! coordctl member add 4 127.0.0.1:7104    # a replica started with --join
//! coordctl member remove 3
//! coordctl member transfer-leader [2]     # hand leadership over (as SIGTERM on the leader does)
//! coordctl dispatcher jobs           # tf.data jobs: mode, clients, tasks, split position
//! coordctl dispatcher workers
//! coordctl dispatcher journal        # one line per dispatcher update
//! coordctl ns create job-7 --job worker=4  # a namespace for one training job
//! coordctl ns list                   # every namespace: usage against its limits
//! coordctl -n job-7 tasks            # any command, in namespace job-7
//! coordctl ns delete job-7
//! coordctl -o json tasks             # JSON for scripts (kv watch: one JSON object per line)
//! coordctl completion bash           # a completion script: bash, zsh, fish (README: "Operate")
//! ```
//!
//! Exit codes: 0 success, 1 the ensemble answered with an error, 2 bad usage (an endpoint that
//! cannot be used included) or a request the ensemble refused as invalid, 3 a key that `try-get`
//! did not find, 4 the ensemble was unreachable. With `-o json`, an error is also printed as
//! `{"error": {"code", "message"}}` on stderr.
//!
//! Modules, bottom up: `output` (tables, JSON, a failure's exit code), then one per subcommand
//! with subcommands of its own (`kv`, `snapshot`, `dispatcher`, `ns`); the rest is here.

use std::process::ExitCode;
use std::time::Duration;

mod dispatcher;
mod kv;
mod ns;
mod output;
mod snapshot;

use clap::{CommandFactory, Parser, Subcommand};
use coord_agent::CoordClient;
use serde_json::{json, Value};
use tonic::Status;

use output::{fail, Output, Table};

#[derive(Parser)]
#[command(name = "coordctl", version, about = "Talk to a coord ensemble")]
struct Cli {
    /// gRPC addresses of the replicas, comma separated: host:port, http://host:port or
    /// https://host:port (https needs --tls-ca).
    #[arg(
        long,
        env = "COORD_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
    )]
    endpoints: Vec<String>,
    /// Give up after the ensemble was unreachable this long.
    #[arg(long, default_value = "10")]
    timeout_secs: u64,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table", global = true)]
    output: Output,
    /// The namespace every command acts in (kubectl's habit; default: the replicas' own).
    #[arg(short, long, env = "COORD_NAMESPACE", global = true)]
    namespace: Option<String>,
    #[command(flatten)]
    tls: coord_agent::tls::TlsArgs,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every replica's view: leader, term, log and applied index, lag behind the leader.
    Status,
    /// Every task: state, incarnation, age of its last heartbeat.
    Tasks,
    /// Open barriers: who arrived, who is missing, the time left.
    Barriers,
    /// Every replica takes a snapshot now (and compacts its log); `snapshot save FILE`: a backup.
    Snapshot {
        #[command(subcommand)]
        save: Option<snapshot::SnapshotCmd>,
    },
    /// The key-value store.
    #[command(subcommand)]
    Kv(kv::KvCmd),
    /// The ensemble's replicas.
    #[command(subcommand)]
    Member(MemberCmd),
    /// The coordinated job's runs.
    #[command(subcommand)]
    Run(RunCmd),
    /// The tf.data dispatcher: jobs, workers, journal.
    #[command(subcommand)]
    Dispatcher(dispatcher::DispatcherCmd),
    /// Namespaces: one per training job, each with its own keys, tasks and limits.
    #[command(subcommand)]
    Ns(ns::NsCmd),
    /// Health check of one replica over its HTTP port (`/readyz`, or `/livez` with --live):
    /// exit 0 if healthy, 1 if not. For container health checks (images without curl).
    Health {
        /// The replica's --http-listen address.
        #[arg(long, default_value = "127.0.0.1:8101")]
        http: String,
        /// Only check that the process serves (`/livez`), not that it is ready.
        #[arg(long)]
        live: bool,
    },
    /// Print a completion script for SHELL (see the README's "Operate" for where it goes).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Subcommand)]
enum MemberCmd {
    /// The replicas, as the leader sees them.
    List,
    /// Add a replica (started with --join): it catches up as a learner, then votes.
    Add { id: u64, addr: String },
    /// Remove a replica (stop it afterwards).
    Remove { id: u64 },
    /// Hand leadership to voter ID (default: the most up-to-date one), as a leader's graceful
    /// stop does: calls stall for the handoff, not for an election.
    TransferLeader { id: Option<u64> },
}

#[derive(Subcommand)]
enum RunCmd {
    /// End the job's current run: every task is disconnected, its barrier instances and the keys
    /// it wrote are deleted, and the next run begins (the job's tasks register into it). A job
    /// started again after all its tasks stopped gets a new run by itself; this is for a run
    /// left half alive.
    End {
        #[arg(long, default_value = "ended by coordctl")]
        reason: String,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Needs no ensemble: before the endpoints are even looked at.
    if let Cmd::Completion { shell } = cli.command {
        let mut command = Cli::command();
        clap_complete::generate(shell, &mut command, "coordctl", &mut std::io::stdout());
        return ExitCode::SUCCESS;
    }
    let mut options = match cli.tls.client_options(cli.endpoints.clone()) {
        Ok(o) => o,
        Err(e) => return fail(&Status::invalid_argument(e), cli.output),
    };
    options.unavailable_after = Duration::from_secs(cli.timeout_secs);
    options.namespace = cli.namespace.clone();
    let client = match CoordClient::new(options) {
        Ok(c) => c,
        Err(e) => return fail(&e, cli.output),
    };
    let out = cli.output;
    let result = match cli.command {
        Cmd::Status => status(&client, out).await,
        Cmd::Tasks => tasks(&client, out).await,
        Cmd::Barriers => barriers(&client, out).await,
        Cmd::Snapshot { save } => snapshot::run(&client, client.endpoints(), save, out).await,
        Cmd::Kv(cmd) => kv::run(&client, cmd, out).await,
        Cmd::Member(cmd) => member(&client, cmd, out).await,
        Cmd::Run(RunCmd::End { reason }) => end_run(&client, &reason, out).await,
        Cmd::Dispatcher(cmd) => dispatcher::run(&client, cmd, out).await,
        Cmd::Ns(cmd) => ns::run(&client, cmd, out).await,
        Cmd::Health { http, live } => Ok(health(&http, if live { "/livez" } else { "/readyz" })),
        Cmd::Completion { .. } => Ok(ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => fail(&e, out),
    }
}

async fn status(client: &CoordClient, out: Output) -> Result<ExitCode, Status> {
    let mut replies = Vec::new();
    for (i, ep) in client.endpoints().iter().enumerate() {
        replies.push((ep, client.status_of(i).await));
    }
    if replies.iter().all(|(_, r)| r.is_err()) {
        return Err(Status::unavailable("no replica answered"));
    }
    // Lag: how far each replica's applied state is behind the leader's log.
    let leader_log = replies
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .find(|s| s.state == "Leader")
        .map(|s| s.last_log_index);
    let mut t = Table::new(&[
        "ENDPOINT",
        "ID",
        "STATE",
        "LEADER",
        "TERM",
        "LAST LOG",
        "APPLIED",
        "LAG",
        "STATE BYTES",
        "QUOTA BYTES",
        "ALARM",
        "ERROR",
    ]);
    for (ep, r) in replies {
        match r {
            Ok(s) => t.push(vec![
                json!(ep),
                json!(s.id),
                json!(s.state),
                json!(s.leader_id),
                json!(s.term),
                json!(s.last_log_index),
                json!(s.last_applied),
                json!(leader_log.map(|l| l.saturating_sub(s.last_applied))),
                json!(s.state_bytes),
                json!(s.quota_bytes),
                if s.quota_alarm {
                    json!("NOSPACE")
                } else {
                    Value::Null
                },
                Value::Null,
            ]),
            Err(e) => t.push(vec![
                json!(ep),
                Value::Null,
                json!("unreachable"),
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                Value::Null,
                json!(e.message()),
            ]),
        }
    }
    t.print(out);
    Ok(ExitCode::SUCCESS)
}

async fn tasks(client: &CoordClient, out: Output) -> Result<ExitCode, Status> {
    let reply = client.tasks().await?;
    let mut t = Table::new(&["TASK", "STATE", "INCARNATION", "HEARTBEAT AGE MS", "ERROR"]);
    for r in reply.tasks {
        t.push(vec![
            json!(format!("/job:{}/task:{}", r.job, r.task)),
            json!(r.state),
            json!(format!("{:#x}", r.incarnation)),
            json!(r.heartbeat_age_ms),
            if r.error_message.is_empty() {
                Value::Null
            } else {
                json!(r.error_message)
            },
        ]);
    }
    t.print(out);
    Ok(ExitCode::SUCCESS)
}

async fn barriers(client: &CoordClient, out: Output) -> Result<ExitCode, Status> {
    let reply = client.barriers().await?;
    let mut t = Table::new(&["ID", "COUNTER", "ARRIVED", "MISSING", "MS LEFT"]);
    for b in reply.barriers {
        t.push(vec![
            json!(b.id),
            json!(b.counter),
            json!(b.arrived),
            json!(b.missing),
            json!(b.ms_left),
        ]);
    }
    t.print(out);
    Ok(ExitCode::SUCCESS)
}

async fn end_run(client: &CoordClient, reason: &str, out: Output) -> Result<ExitCode, Status> {
    let run = client.end_run(reason).await?;
    let mut t = Table::new(&["RUN BEGUN"]);
    t.push(vec![json!(run)]);
    t.print(out);
    Ok(ExitCode::SUCCESS)
}

async fn member(client: &CoordClient, cmd: MemberCmd, out: Output) -> Result<ExitCode, Status> {
    let members = match cmd {
        MemberCmd::TransferLeader { id } => {
            let reply = client.transfer_leader(id).await?;
            let mut t = Table::new(&["LEADER", "MILLIS"]);
            t.push(vec![json!(reply.leader), json!(reply.millis)]);
            t.print(out);
            return Ok(ExitCode::SUCCESS);
        }
        MemberCmd::List => client.members().await?,
        MemberCmd::Add { id, addr } => client.add_member(id, &addr).await?,
        MemberCmd::Remove { id } => client.remove_member(id).await?,
    };
    let mut t = Table::new(&["ID", "ADDRESS", "ROLE", "MATCHED"]);
    for m in members {
        let role = if m.voter { "voter" } else { "learner" };
        t.push(vec![
            json!(m.id),
            json!(m.addr),
            json!(role),
            json!(m.matched_index),
        ]);
    }
    t.print(out);
    Ok(ExitCode::SUCCESS)
}

/// GET `path` from `addr` with a plain HTTP/1.1 request; prints the body.
fn health(addr: &str, path: &str) -> ExitCode {
    use std::io::{Read, Write};
    let get = || -> std::io::Result<String> {
        let sock = std::net::ToSocketAddrs::to_socket_addrs(addr)?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("cannot resolve {addr}")))?;
        let mut s = std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    };
    match get() {
        Ok(resp) => {
            let ok = resp.starts_with("HTTP/1.1 200") || resp.starts_with("HTTP/1.0 200");
            let body = resp.split("\r\n\r\n").nth(1).unwrap_or("").trim();
            println!("{body}");
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("coordctl: {addr}{path}: {e}");
            ExitCode::FAILURE
        }
    }
}

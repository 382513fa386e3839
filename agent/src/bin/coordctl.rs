//! `coordctl`: talk to a coord ensemble from a shell. Give it any or all replicas; it finds the
//! leader and follows it.
//!
//! ```text
//! coordctl --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 status
//! coordctl kv put config/lr 0.01
//! coordctl kv get config/lr          # waits until the key exists
//! coordctl kv ls config
//! coordctl kv rm config
//! coordctl member list
//! coordctl member add 4 127.0.0.1:7104    # a replica started with --join
//! coordctl member remove 3
//! ```
//!
//! Exit codes: 0 success, 1 the ensemble answered with an error, 2 bad usage, 3 a key that
//! `try-get` did not find, 4 the ensemble was unreachable.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use coord_agent::{ClientOptions, CoordClient};
use tonic::{Code, Status};

#[derive(Parser)]
#[command(name = "coordctl", version, about = "Talk to a coord ensemble")]
struct Cli {
    /// gRPC addresses of the replicas, comma separated.
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
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every replica's view: leader, term, log and applied index.
    Status,
    /// The key-value store.
    #[command(subcommand)]
    Kv(KvCmd),
    /// The ensemble's replicas.
    #[command(subcommand)]
    Member(MemberCmd),
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
}

#[derive(Subcommand)]
enum MemberCmd {
    /// The replicas, as the leader sees them.
    List,
    /// Add a replica (started with --join): it catches up as a learner, then votes.
    Add { id: u64, addr: String },
    /// Remove a replica (stop it afterwards).
    Remove { id: u64 },
}

#[derive(Subcommand)]
enum KvCmd {
    /// Insert a key (fails if it exists, unless --overwrite).
    Put {
        key: String,
        value: String,
        #[arg(long)]
        overwrite: bool,
    },
    /// Print a key's value, waiting until it exists.
    Get { key: String },
    /// Print a key's value; exit 3 if it does not exist.
    TryGet { key: String },
    /// List the keys and values under a directory.
    Ls { dir: String },
    /// Delete a key and everything under it.
    Rm { key: String },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut options = ClientOptions::new(cli.endpoints.clone());
    options.unavailable_after = Duration::from_secs(cli.timeout_secs);
    let client = match CoordClient::new(options) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let result = match cli.command {
        Cmd::Status => status(&client, &cli.endpoints).await,
        Cmd::Kv(cmd) => kv(&client, cmd).await,
        Cmd::Member(cmd) => member(&client, cmd).await,
        Cmd::Health { http, live } => Ok(health(&http, if live { "/livez" } else { "/readyz" })),
    };
    match result {
        Ok(code) => code,
        Err(e) => fail(&e),
    }
}

fn fail(e: &Status) -> ExitCode {
    eprintln!("coordctl: {:?}: {}", e.code(), e.message());
    match e.code() {
        Code::Unavailable => ExitCode::from(4),
        Code::InvalidArgument => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

async fn status(client: &CoordClient, endpoints: &[String]) -> Result<ExitCode, Status> {
    println!(
        "{:<22} {:>4} {:<10} {:>6} {:>8} {:>10} {:>12}",
        "ENDPOINT", "ID", "STATE", "LEADER", "TERM", "LAST LOG", "LAST APPLIED"
    );
    let mut reachable = 0;
    for (i, ep) in endpoints.iter().enumerate() {
        match client.status_of(i).await {
            Ok(s) => {
                reachable += 1;
                let leader = s.leader_id.map_or("-".to_string(), |l| l.to_string());
                println!(
                    "{ep:<22} {:>4} {:<10} {leader:>6} {:>8} {:>10} {:>12}",
                    s.id, s.state, s.term, s.last_log_index, s.last_applied
                );
            }
            Err(e) => println!("{ep:<22} unreachable: {}", e.message()),
        }
    }
    if reachable == 0 {
        return Err(Status::unavailable("no replica answered"));
    }
    Ok(ExitCode::SUCCESS)
}

async fn member(client: &CoordClient, cmd: MemberCmd) -> Result<ExitCode, Status> {
    let members = match cmd {
        MemberCmd::List => client.members().await?,
        MemberCmd::Add { id, addr } => client.add_member(id, &addr).await?,
        MemberCmd::Remove { id } => client.remove_member(id).await?,
    };
    println!(
        "{:>4} {:<22} {:<8} {:>8}",
        "ID", "ADDRESS", "ROLE", "MATCHED"
    );
    for m in members {
        let matched = m.matched_index.map_or("-".to_string(), |i| i.to_string());
        let role = if m.voter { "voter" } else { "learner" };
        println!("{:>4} {:<22} {role:<8} {matched:>8}", m.id, m.addr);
    }
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

async fn kv(client: &CoordClient, cmd: KvCmd) -> Result<ExitCode, Status> {
    match cmd {
        KvCmd::Put {
            key,
            value,
            overwrite,
        } => client.insert(&key, value.into_bytes(), overwrite).await?,
        KvCmd::Get { key } => println!("{}", String::from_utf8_lossy(&client.get(&key).await?)),
        KvCmd::TryGet { key } => match client.try_get(&key).await? {
            Some(v) => println!("{}", String::from_utf8_lossy(&v)),
            None => {
                eprintln!("coordctl: key {key:?} not found");
                return Ok(ExitCode::from(3));
            }
        },
        KvCmd::Ls { dir } => {
            for (k, v) in client.get_dir(&dir).await? {
                println!("{k}\t{}", String::from_utf8_lossy(&v));
            }
        }
        KvCmd::Rm { key } => client.delete(&key).await?,
    }
    Ok(ExitCode::SUCCESS)
}

//! coord-certs: makes a test CA and the certificates of a coord ensemble (see `deploy/make-certs.sh`).
//!
//! ```text
//! coord-certs ensemble --dir certs --replica 1=127.0.0.1 --replica 2=127.0.0.1 --replica 3=127.0.0.1 \
//!     --task worker=2 --client ops
//! coord-certs task --dir certs --job worker --index 7      # one more, signed by the CA in certs/
//! ```
//!
//! Files: `ca.crt`/`ca.key`, `replica-<id>.crt/.key`, `task-<job>-<index>.crt/.key`,
//! `client-<name>.crt/.key`. For tests and trials: keep `ca.key` safe or use your own CA in
//! production (any CA works; certificates need the URI alternative names described in docs/operations.md, "TLS").

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use coord_proto::tls::Identity;
use coord_tools::certs::{stem, Ca};

#[derive(Parser)]
#[command(
    name = "coord-certs",
    about = "Make a test CA and certificates for a coord ensemble"
)]
struct Cli {
    /// Where the CA and certificates are (written and read).
    #[arg(long, global = true, default_value = "certs")]
    dir: PathBuf,
    /// The ensemble's name: the replicas' --cluster-token.
    #[arg(long, global = true, default_value = "coord")]
    cluster: String,
    /// The namespace the task certificates made belong to (`coord://<ensemble>/ns/<name>/task/
    /// ...`): such a task acts only in that namespace. Without it, they act in the default one.
    #[arg(long, global = true)]
    namespace: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// A new CA (ca.crt, ca.key), then every certificate named.
    Ensemble {
        /// A replica and the hosts it is reached by: `id=host[,host...]`.
        #[arg(long = "replica", value_parser = parse_replica)]
        replicas: Vec<(u64, Vec<String>)>,
        /// Tasks `job=count`: a certificate for each task 0..count.
        #[arg(long = "task", value_parser = parse_tasks)]
        tasks: Vec<(String, u32)>,
        /// An operator's or tool's certificate (coordctl, a proxy serving several tasks).
        #[arg(long = "client")]
        clients: Vec<String>,
    },
    /// A new CA only.
    Ca,
    /// A replica's certificate, signed by the CA in --dir.
    Replica {
        #[arg(long)]
        id: u64,
        /// A host name or IP address the replica is reached by (repeat for each).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
    },
    /// A task's certificate, signed by the CA in --dir.
    Task {
        #[arg(long)]
        job: String,
        #[arg(long)]
        index: u32,
    },
    /// An operator's or tool's certificate, signed by the CA in --dir.
    Client {
        #[arg(long)]
        name: String,
    },
}

fn parse_replica(s: &str) -> Result<(u64, Vec<String>), String> {
    let (id, hosts) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not id=host[,host...]"))?;
    let id = id
        .parse()
        .map_err(|_| format!("replica id {id:?} is not a number"))?;
    let hosts: Vec<String> = hosts.split(',').map(str::to_string).collect();
    if hosts.iter().any(String::is_empty) {
        return Err(format!("{s:?}: a host is empty"));
    }
    Ok((id, hosts))
}

fn parse_tasks(s: &str) -> Result<(String, u32), String> {
    let (job, n) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not job=count"))?;
    let n = n
        .parse()
        .map_err(|_| format!("task count {n:?} is not a number"))?;
    Ok((job.to_string(), n))
}

fn issue(ca: &Ca, dir: &Path, identity: Identity, hosts: &[String]) -> Result<(), String> {
    let files = ca.issue(&identity, hosts)?.write(dir, &stem(&identity))?;
    println!(
        "{identity}: {} {}",
        files.cert.display(),
        files.key.display()
    );
    Ok(())
}

fn run(cli: Cli) -> Result<(), String> {
    let (dir, cluster) = (&cli.dir, cli.cluster.clone());
    let task = |job: &str, index| Identity::Task {
        cluster: cluster.clone(),
        job: job.to_string(),
        index,
        namespace: cli.namespace.clone(),
    };
    match cli.command {
        Cmd::Ensemble {
            replicas,
            tasks,
            clients,
        } => {
            let ca = Ca::new(&cluster)?;
            println!("CA: {}", ca.write(dir)?.display());
            for (id, hosts) in replicas {
                let id = Identity::Replica {
                    cluster: cluster.clone(),
                    id,
                };
                issue(&ca, dir, id, &hosts)?;
            }
            for (job, n) in tasks {
                for index in 0..n {
                    issue(&ca, dir, task(&job, index), &[])?;
                }
            }
            for name in clients {
                let id = Identity::Client {
                    cluster: cluster.clone(),
                    name,
                };
                issue(&ca, dir, id, &[])?;
            }
        }
        Cmd::Ca => println!("CA: {}", Ca::new(&cluster)?.write(dir)?.display()),
        Cmd::Replica { id, hosts } => {
            let id = Identity::Replica {
                cluster: cluster.clone(),
                id,
            };
            issue(&Ca::load(dir, &cluster)?, dir, id, &hosts)?;
        }
        Cmd::Task { job, index } => issue(&Ca::load(dir, &cluster)?, dir, task(&job, index), &[])?,
        Cmd::Client { name } => {
            let id = Identity::Client {
                cluster: cluster.clone(),
                name,
            };
            issue(&Ca::load(dir, &cluster)?, dir, id, &[])?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("coord-certs: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `data-worker`: a tf.data worker for the dispatcher the coordinator ensemble serves.
//!
//! ```text
//! data-worker --coordinators 10.0.0.1:7101,10.0.0.2:7101,10.0.0.3:7101 --listen 0.0.0.0:7300 \
//!     --advertise 10.0.0.7:7300 [--namespace NAME]
//! ```
//!
//! It heartbeats the dispatcher (through any replica), runs the tasks it is given and serves
//! their elements to consumers on `--listen`. On start it prints `data-worker serving <address>`
//! on stdout; it logs to stderr (`RUST_LOG` filters, default `info`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use coord_agent::data::{DataWorkerService, DispatchClient};
use coord_agent::CoordClient;
use coord_proto::coord::dispatcher::data_worker_server::DataWorkerServer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

#[derive(Parser)]
#[command(
    name = "data-worker",
    version,
    about = "tf.data worker for a coord ensemble"
)]
struct Cli {
    /// gRPC addresses of the ensemble's replicas, comma separated: host:port, http://host:port
    /// or https://host:port (https needs --tls-ca).
    #[arg(long, env = "COORD_ENDPOINTS", value_delimiter = ',', required = true)]
    coordinators: Vec<String>,
    /// Where consumers reach this worker (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The address to publish to the dispatcher, if not the listening address (behind NAT, in a
    /// container).
    #[arg(long)]
    advertise: Option<String>,
    /// How often the worker heartbeats the dispatcher.
    #[arg(long, default_value_t = 1000)]
    heartbeat_ms: u64,
    /// The namespace whose dispatcher this worker serves (it must exist: `coordctl ns create`,
    /// or a job's `coord-proxy --namespace`). None: the default one.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Threads of the async runtime.
    #[arg(long, default_value_t = 2)]
    worker_threads: usize,
    /// TLS toward the ensemble (the consumers' side stays plain gRPC).
    #[command(flatten)]
    tls: coord_agent::tls::TlsArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs on stderr (tasks started, failed, deleted; heartbeat failures), filtered by RUST_LOG;
    // stdout carries only the "serving" line.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,h2=warn,tower=warn")),
        )
        .with_target(false)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.worker_threads.max(1))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("data-worker: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("data-worker: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let listener = TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    let address = cli.advertise.unwrap_or_else(|| local.to_string());
    let mut options = cli.tls.client_options(cli.coordinators.clone())?;
    options.namespace = cli.namespace;
    let coord = CoordClient::new(options).map_err(|e| e.message().to_string())?;
    let service = DataWorkerService::new(address.clone(), DispatchClient::new(coord));
    tokio::spawn(
        service
            .clone()
            .heartbeat_loop(Duration::from_millis(cli.heartbeat_ms.max(10))),
    );
    println!("data-worker serving {address}");
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(
            DataWorkerServer::new(service)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(256 << 20),
        )
        .serve_with_incoming_shutdown(incoming, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(|e| format!("serving: {e}"))
}

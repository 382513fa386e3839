//! `coord-proxy`: the per-host sidecar that lets unmodified TensorFlow and JAX processes use a
//! coord ensemble.
//!
//! ```text
//! coord-proxy --listen 127.0.0.1:7200 --coordinators 10.0.0.1:7101,10.0.0.2:7101,10.0.0.3:7101
//! ```
//!
//! TensorFlow (`TF_CONFIG`'s `ps:0`) and JAX connect to `--listen` as if it were their coordination
//! service (see the README's "Point TensorFlow at it" and "Point JAX at it"), and TensorFlow's
//! tf.data workers and clients as if it were their dispatcher; the proxy serves all three
//! services there, follows the ensemble's leader and re-drives calls across failovers, so a
//! replica's death never reaches them (see `coord_agent::proxy`). With `--tcpstore-listen` it
//! also serves torch's TCPStore (torchrun's rendezvous, `init_process_group`'s store).

use std::net::SocketAddr;
use std::process::ExitCode;

/// The coordinator's allocator: thousands of torch connections at once are small allocations
/// (glibc malloc took a sixth of the proxy's time in a 4096-rank burst).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::time::Duration;

use clap::Parser;
use coord_agent::proxy::{tf::TfProxy, tfdata::TfDataProxy, xla::XlaProxy};
use coord_agent::CoordClient;
use coord_proto::tensorflow::coordination_service_server::CoordinationServiceServer as TfServer;
use coord_proto::tensorflow::data::dispatcher_service_server::DispatcherServiceServer;
use coord_proto::xla::coordination::coordination_service_server::CoordinationServiceServer;
use tonic::codec::CompressionEncoding;

#[derive(Parser)]
#[command(
    name = "coord-proxy",
    version,
    about = "Sidecar between TensorFlow or jaxlib and a coord ensemble"
)]
struct Cli {
    /// Where TensorFlow or jaxlib connects (keep it on localhost).
    #[arg(long, default_value = "127.0.0.1:7200")]
    listen: SocketAddr,
    /// gRPC addresses of the ensemble's replicas, comma separated: host:port, http://host:port
    /// or https://host:port (https needs --tls-ca).
    #[arg(long, env = "COORD_ENDPOINTS", value_delimiter = ',', required = true)]
    coordinators: Vec<String>,
    /// A call fails UNAVAILABLE only after no replica could serve it for this long.
    #[arg(long, default_value_t = 120)]
    unavailable_after_secs: u64,
    /// The TensorFlow task this proxy serves (JOB:ID, e.g. worker:1); with --push-errors-to.
    #[arg(long, requires = "push_errors_to")]
    task: Option<String>,
    /// That task's own gRPC address (its TF_CONFIG entry): the errors it must learn of are pushed
    /// there (ReportErrorToTask) as the ensemble commits them, as TensorFlow's own service does,
    /// instead of waiting for its next heartbeat.
    #[arg(long, requires = "task")]
    push_errors_to: Option<String>,
    /// TensorFlow's tf.data workers: the most splits of a DYNAMIC iteration taken from the
    /// ensemble at once (one journal update for all), handed to this host's workers one per
    /// GetSplit. A lease starts at one split and doubles while the last was used up within
    /// 25 ms, halving when one lasted over 100 ms. 1 sends every GetSplit to the ensemble.
    #[arg(long, default_value_t = coord_agent::proxy::tfdata::DEFAULT_SPLIT_LEASE)]
    tfdata_split_lease: u64,
    /// TensorFlow's heartbeats of the tasks behind this proxy are held up to this long (ms) and
    /// sent to the ensemble as one call, each task answered as its own call would be. Keep it well
    /// under the agents' heartbeat interval (half TensorFlow's heartbeat timeout). 0 sends each
    /// heartbeat on its own, at once.
    #[arg(long, default_value_t = coord_agent::proxy::beats::DEFAULT_WINDOW.as_millis() as u64)]
    heartbeat_batch_ms: u64,
    /// Send each task's Barrier (TensorFlow's and jaxlib's), WaitForAllTasks and jaxlib's
    /// GetAliveTasks call to the ensemble on its own, parked there until the barrier passes,
    /// instead of recording the tasks' arrivals together and waiting on each barrier instance (or
    /// round of GetAliveTasks, and fetching the job's devices) with one call for all of them (the
    /// default).
    #[arg(long)]
    barriers_one_by_one: bool,
    /// Also serve torch's TCPStore protocol here (HOST:PORT), over the ensemble: point torchrun's
    /// --rdzv-endpoint, or MASTER_ADDR/MASTER_PORT with TORCHELASTIC_USE_AGENT_STORE=True, at it.
    #[arg(long, env = "COORD_TCPSTORE_LISTEN")]
    tcpstore_listen: Option<SocketAddr>,
    /// Put every torch key under this prefix in the ensemble, so that jobs sharing an ensemble
    /// each see a store of their own (give every host of a job the same one).
    #[arg(long, env = "COORD_TCPSTORE_PREFIX", default_value = "")]
    tcpstore_prefix: String,
    /// TLS toward the ensemble; jaxlib's side (--listen) stays plain gRPC on localhost. Give the
    /// proxy the certificate of the task it serves.
    #[command(flatten)]
    tls: coord_agent::tls::TlsArgs,
    /// Put all of this job's traffic in namespace NAME: its keys, tasks, barriers and torch store
    /// are its own, apart from every other job on the ensemble. Declared on start with the job
    /// flags below (every sidecar of a job must give the same). Without TLS the sidecar is
    /// trusted to name its job's namespace; with TLS a task certificate of a namespace binds it.
    #[arg(long, env = "COORD_NAMESPACE")]
    namespace: Option<String>,
    /// The namespace's job (with --namespace).
    #[command(flatten)]
    shape: coord_agent::namespace::ShapeArgs,
    /// The namespace's limits (with --namespace; 0 takes the ensemble's default).
    #[command(flatten)]
    limits: coord_agent::namespace::LimitArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    raise_open_files_limit();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("coord-proxy: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    let mut options = match cli.tls.client_options(cli.coordinators.clone()) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("coord-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    options.unavailable_after = Duration::from_secs(cli.unavailable_after_secs);
    let declaration = match &cli.namespace {
        Some(name) => match coord_agent::namespace::declaration(name, &cli.shape, &cli.limits) {
            Ok(d) => Some(d),
            Err(e) => {
                eprintln!("coord-proxy: {e}");
                return ExitCode::from(2);
            }
        },
        None if !cli.shape.jobs.is_empty() || cli.shape.cluster_config.is_some() => {
            eprintln!("coord-proxy: --job and --cluster-config shape a namespace: give --namespace too (the default namespace's job is the replicas' flags)");
            return ExitCode::from(2);
        }
        None => None,
    };
    options.namespace = cli.namespace.clone();
    let client = match CoordClient::new(options) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("coord-proxy: {}", e.message());
            return ExitCode::from(2);
        }
    };
    let pushed = match (&cli.task, &cli.push_errors_to) {
        (Some(t), Some(address)) => match coord_agent::proxy::push::parse_task(t) {
            Ok(task) => Some((task, address.clone())),
            Err(e) => {
                eprintln!("coord-proxy: --task: {e}");
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    client.find_leader().await;
    if let Some(d) = declaration {
        let name = d.name.clone();
        match client.declare_namespace(d).await {
            Ok(r) => eprintln!(
                "coord-proxy: namespace {name:?} {}",
                if r.created { "created" } else { "joined" }
            ),
            Err(e) => {
                eprintln!(
                    "coord-proxy: cannot declare namespace {name:?}: {}",
                    e.message()
                );
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some((task, address)) = pushed {
        tokio::spawn(coord_agent::proxy::push::push_errors(
            client.clone(),
            task,
            address,
        ));
    }
    if let Some(addr) = cli.tcpstore_listen {
        let torch = match listen_for_ranks(addr) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("coord-proxy: cannot listen on {addr} (--tcpstore-listen): {e}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("coord-proxy: serving torch's TCPStore on {addr}");
        tokio::spawn(coord_agent::proxy::tcpstore::serve(
            torch,
            client.clone(),
            bytes::Bytes::from(cli.tcpstore_prefix.clone().into_bytes()),
        ));
    }
    let listener = match tokio::net::TcpListener::bind(cli.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("coord-proxy: cannot listen on {}: {e}", cli.listen);
            return ExitCode::FAILURE;
        }
    };
    let xla = XlaProxy::new(client.clone()).with_barriers_together(!cli.barriers_one_by_one);
    let service = CoordinationServiceServer::new(xla)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
        .accept_compressed(CompressionEncoding::Gzip);
    let tf = TfProxy::new(client.clone())
        .with_heartbeat_window(Duration::from_millis(cli.heartbeat_batch_ms))
        .with_barriers_together(!cli.barriers_one_by_one);
    let tf = TfServer::new(tf)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
        .accept_compressed(CompressionEncoding::Gzip);
    let tfdata = DispatcherServiceServer::new(
        TfDataProxy::new(client.clone()).with_split_lease(cli.tfdata_split_lease),
    )
    .max_decoding_message_size(64 << 20)
    .max_encoding_message_size(64 << 20)
    .accept_compressed(CompressionEncoding::Gzip);
    eprintln!(
        "coord-proxy: serving tensorflow.CoordinationService, tensorflow.data.DispatcherService and xla.coordination.CoordinationService on {} for {}",
        cli.listen,
        client.endpoints().join(",")
    );
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    // SIGTERM is how Kubernetes (and systemd) stop a sidecar: stop accepting, let calls in flight
    // finish for a moment, and exit 0. A long poll (a blocking get, a WAIT) is not waited for past
    // the grace period: its client is going away with this pod anyway.
    let (stopping, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        termination().await;
        eprintln!("coord-proxy: stopping (signal)");
        let _ = stopping.send(());
    };
    let server = tonic::transport::Server::builder()
        .add_service(service)
        .add_service(tf)
        .add_service(tfdata)
        .serve_with_incoming_shutdown(incoming, shutdown);
    let grace = async {
        if stopped.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        served = server => match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("coord-proxy: {e}");
                ExitCode::FAILURE
            }
        },
        () = grace => ExitCode::SUCCESS,
    }
}

/// Takes the host's hard limit of open files: a proxy in front of a whole job's ranks holds one
/// connection per rank (see `coord_agent::open_files`). Not fatal where it cannot: a small job
/// needs no more.
fn raise_open_files_limit() {
    match coord_agent::open_files::raise_to_hard_limit() {
        Ok(Some((from, to))) => {
            eprintln!("coord-proxy: open files limit raised from {from} to {to}")
        }
        Ok(None) => {}
        Err(e) => eprintln!("coord-proxy: warning: cannot raise the open files limit: {e}"),
    }
}

/// torch's store listener: every rank of a job may connect at the same moment (thousands), and
/// tokio's default backlog of 1024 would drop the SYNs past it for a second's retransmit.
fn listen_for_ranks(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    // The kernel caps it at net.core.somaxconn.
    socket.listen(16 << 10)
}

/// How long calls in flight may take to finish after SIGTERM or SIGINT.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// SIGINT or SIGTERM, whichever comes first.
async fn termination() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                eprintln!("coord-proxy: cannot watch SIGTERM ({e}); SIGINT still stops it");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}

//! coord-server: one replica of a coord ensemble (binary `coordinator`).
//!
//! The crate is in four layers, each a folder; [`replica`] wires them together and owns the order
//! in which they start and stop. Bottom up: [`error`] (the error type and its one mapping to gRPC
//! codes) and [`tasks`] (ownership of background loops) use nothing of the crate; then:
//!
//! - [`ops`]: what an operator sets and reads: flags, the data directory's identity, TLS and who
//!   may do what, per-client limits, request ids, metrics.
//! - [`raft`]: the Raft node's side of the network and of leadership: the openraft network adapter
//!   and its receiving service, Raft links and pre-appends, the port's accept loop, peer channels,
//!   who leads, prompt elections, membership changes.
//! - [`serve`]: what a call does once it reaches the leader. The [`serve::route`] router runs every
//!   call on the leader (forwarding, re-driving across leader changes); the semantics are written
//!   once for every surface ([`serve::kv`], [`serve::coordination`], [`serve::dispatcher`]); writes
//!   go through the batching [`serve::proposer`], reads through the batched [`serve::read_index`];
//!   applied changes reach the [`serve::apply_hub`], which wakes [`serve::parked`] calls and feeds
//!   the [`serve::watch_hub`]; leader duties run beside them (heartbeat checks, barrier deadlines,
//!   cluster set-up).
//! - [`api`]: one wire adapter per surface. Each decodes its protocol's messages, hands the call to
//!   the router and encodes the answer; none holds semantics. TensorFlow's
//!   `tensorflow.CoordinationService` ([`api::tf`]), jaxlib's `xla.coordination.CoordinationService`
//!   ([`api::xla`]), and coord's own: key-value increments and watches ([`api::kv`]), error polling
//!   ([`api::coordination`]), the tf.data dispatcher ([`api::dispatcher`]), administration
//!   ([`api::admin`]); and the HTTP port (health, status, metrics, the status page).
//!
//! Two uses go down-to-up, and neither closes a circle: `ops::tls`, which assembles a replica's
//! TLS, makes the Raft links' (`raft::link_tls`), and a leadership hand-off (`raft::handoff`)
//! drains `serve::proposer`. No file uses another that uses it back, directly or round a longer
//! circle: `tests/tests/house.rs` checks every crate for one.

pub mod api;
pub mod error;
pub mod ops;
pub mod raft;
pub mod replica;
pub mod serve;
pub mod tasks;

pub use ops::config::Args;
pub use replica::{Replica, StartError};

/// Runs a replica until SIGINT or SIGTERM.
pub async fn run(args: Args) -> Result<(), StartError> {
    // First: a second process on this data directory must say so, not that its ports are taken.
    let data_lock = ops::data_lock::DataLock::take(&args.data_dir)?;
    let grpc = replica::bind(args.listen, "gRPC, --listen").await?;
    let http = replica::bind(args.http_listen, "HTTP, --http-listen").await?;
    let replica = Replica::open(args, data_lock).await?;
    replica.serve(grpc, http, shutdown_signal()).await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

//! coord-server: one replica of a coord ensemble (binary `coordinator`).
//!
//! Request path: a gRPC call reaches a wire adapter ([`tf_service`], [`coord_service`],
//! [`kv_service`], or [`xla_service`] for jaxlib) hands it to the [`route::Router`]; the router runs it on the leader, locally or forwarded, and
//! re-drives it when leadership moves. On the leader the semantics ([`kv::KvCore`],
//! [`coordination::CoordCore`]) write through the batching [`proposer`] and read after the batched
//! [`read_index`]. The state machine reports applied changes to the [`apply_hub`], which wakes
//! [`parked`] calls, feeds the [`barrier_timer`] and records changes for watches in the
//! [`watch_hub`].
//!
//! Leader-only duties: [`cluster_init`] (the first leader sets the cluster up), [`heartbeats`]
//! (silent tasks go to ERROR), [`barrier_timer`] (deadlines). [`wire`] converts TensorFlow's
//! types.
//!
//! - [`config`], [`identity`]: flags, and the check that a data directory is this replica's.
//! - [`replica`]: wiring, start and stop order.
//! - [`raft_network`], [`raft_service`], [`peers`]: the openraft network adapter over gRPC.
//! - [`accept`]: the gRPC port's accept loop; peers' Raft connections are served on the Raft
//!   runtime, everything else on the client runtime.
//! - [`leader`]: who leads, from Raft metrics; [`election`]: a prompt election after a leader
//!   dies.
//! - [`request_id`]: request ids in metadata, and ids for requests without one.
//! - [`membership`]: adding and removing replicas at runtime, refused when quorum would be lost.
//! - [`http`], [`status`], [`metrics`]: `/livez`, `/readyz`, `/status`, `/metrics`, admin RPC.
//! - [`error`]: the error type and its single mapping to gRPC status codes.
//! - [`tls`], [`authz`]: TLS from the `--tls-*` flags; who a caller is, and what it may do.
//! - [`tasks`]: ownership of background loops.

pub mod accept;
pub mod apply_hub;
pub mod authz;
pub mod barrier_timer;
pub mod cluster_init;
pub mod config;
pub mod coord_service;
pub mod coordination;
pub mod dispatcher;
pub mod election;
pub mod error;
pub mod heartbeats;
pub mod http;
pub mod identity;
pub mod kv;
pub mod kv_service;
pub mod leader;
pub mod limits;
pub mod membership;
pub mod metrics;
pub mod oversized;
pub mod parked;
pub mod peers;
pub mod pre_append;
pub mod proposer;
pub mod raft_link;
pub mod raft_network;
pub mod raft_service;
pub mod read_index;
pub mod replica;
pub mod request_id;
pub mod route;
pub mod status;
pub mod tasks;
pub mod tf_service;
pub mod tls;
pub mod watch_hub;
pub mod wire;
pub mod xla_errors;
pub mod xla_service;

pub use config::Args;
pub use replica::{Replica, StartError};

/// Runs a replica until SIGINT or SIGTERM.
pub async fn run(args: Args) -> Result<(), StartError> {
    let grpc = replica::bind(args.listen, "gRPC, --listen").await?;
    let http = replica::bind(args.http_listen, "HTTP, --http-listen").await?;
    let replica = Replica::open(args).await?;
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

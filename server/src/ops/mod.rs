//! What an operator sets and reads.
//!
//! - [`config`]: flags and their validation ([`namespace_flags`]: the limits namespaces get by
//!   default); [`identity`]: the check that a data directory is this
//!   replica's; [`data_lock`]: one replica process per data directory.
//! - [`tls`], [`authz`]: TLS from the `--tls-*` flags; who a caller is, and what it may do;
//!   [`replica_cert`]: the checks a replica's own certificate passes, at start and at reload;
//!   [`tls_reload`]: the served certificate reloaded on SIGHUP or when its files change.
//! - [`limits`]: per-client admission; [`request_id`]: request ids in metadata.
//! - [`status`]: a replica's view of the ensemble; [`metrics`]: RPC counts and latencies, and the
//!   Prometheus text format (served by [`crate::api::http`]); [`process`]: the `process_*`
//!   metrics.

pub mod authz;
pub mod config;
pub mod data_lock;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod namespace_flags;
pub mod process;
pub mod replica_cert;
pub mod request_id;
pub mod restore;
pub mod status;
pub mod tls;
pub mod tls_reload;

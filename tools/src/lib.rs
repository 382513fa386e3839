//! coord-tools: the tools users run, and the local-process plumbing they share with the
//! multi-process tests (`coord-tests` depends on this crate, never the other way round).
//!
//! Binaries: `coord-certs` (a test CA and an ensemble's certificates; `deploy/make-certs.sh` runs
//! it) and `coord-demo` (a training job that survives the preemption of its chief).
//!
//! The modules, bottom up. Each uses only modules listed before it, so there is no import circle
//! (`tests/tests/house.rs` checks every crate for one):
//!
//! - [`http`]: a minimal HTTP/1.1 GET for `/status`, `/readyz` and `/metrics`.
//! - [`process`]: finding (building) this workspace's binaries, free loopback ports, signals.
//! - [`status`]: what a replica's `/status` says, and when replicas agree on a leader.
//! - [`ensemble`]: real `coordinator` processes on loopback with data in a temp dir: start, kill,
//!   signal and watch replicas; kills what it started when dropped, keeps the logs of a failed
//!   run. The demo's ensemble and the tests' `Cluster` are both this plus their own flags.
//! - [`certs`]: a test CA and the certificates of an ensemble, made with `rcgen`.
//! - [`demo`]: `coord-demo`'s supervisor, its ensemble and its task processes (also the
//!   multi-process preemption scenarios of the tests).

pub mod certs;
pub mod demo;
pub mod ensemble;
pub mod http;
pub mod process;
pub mod status;

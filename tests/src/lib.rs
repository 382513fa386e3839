//! coord-tests: multi-process tests and benchmarks of coord.
//!
//! - [`chaos`]: fault injection (crashes, pauses, partitions from a seeded schedule), histories and
//!   their checkers (linearizability, barriers, lost writes).
//! - [`cli`]: runs `coordctl` as a script would.
//! - [`cluster`]: starts real `coordinator` processes on free loopback ports with data in a temp
//!   dir, restarts and kills them, polls `/status`; kills what it started when dropped, and keeps
//!   the logs and data of a failed test.
//! - [`compose`]: `deploy/compose.yaml`'s ensemble in real containers (image built offline).
//! - [`coord_suite`]: the coordination service's behaviour suite, run against 1- and 3-replica
//!   ensembles.
//! - [`data`]: `data-worker` processes and job consumers for the dispatcher's tests.
//! - [`demo`]: `coord-demo`, a training job that survives the preemption of its chief (and the
//!   multi-process preemption scenarios).
//! - [`jax`]: the real jaxlib client in a venv, its test scripts, and coord-proxy sidecars.
//! - [`link`]: `link-worker` processes for the rendezvous tests and benchmark.
//! - [`http`]: a minimal HTTP/1.1 GET for `/status`, `/readyz` and `/metrics`.
//! - [`bench`]: coord-bench's load generators, failover measurement, and its targets (coord and
//!   etcd 3.4).

pub mod bench;
pub mod certs;
pub mod chaos;
pub mod cli;
pub mod cluster;
pub mod compose;
pub mod coord_suite;
pub mod data;
pub mod demo;
pub mod http;
pub mod jax;
pub mod link;
pub mod tfdata;
pub mod venv;

pub use cluster::{Cluster, ClusterOptions};

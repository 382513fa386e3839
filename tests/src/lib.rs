//! coord-tests: multi-process tests and benchmarks of coord. The tools users run (`coord-certs`,
//! `coord-demo`) are in `coord-tools`; the preemption tests drive `coord-demo`'s job from there.
//!
//! The modules, bottom up. Each uses only modules listed before it, so there is no import circle
//! (`tests/tests/house.rs` checks every crate for one):
//!
//! - [`http`]: a minimal HTTP/1.1 GET for `/status`, `/readyz` and `/metrics` (`coord-tools`').
//! - [`venv`]: Python venvs for the tests that run a real Python library, and the guard that
//!   kills their processes.
//! - [`certs`]: the TLS tests' test CA and replica certificates (`TestPki`), made with
//!   `coord-tools`' CA.
//! - [`cli`]: runs `coordctl` as a script would.
//! - [`compose`]: `deploy/compose.yaml`'s ensemble in real containers (image built offline).
//! - [`data`]: `data-worker` processes and job consumers for the dispatcher's tests.
//! - [`link`]: `link-worker` processes for the rendezvous tests and benchmark.
//! - [`tf_conformance`]: the conformance script of TensorFlow's coordination service, run
//!   against TensorFlow's own service and against the ensemble.
//! - [`cluster`]: starts real `coordinator` processes on free loopback ports with data in a temp
//!   dir, restarts and kills them, polls `/status`; kills what it started when dropped, and keeps
//!   the logs and data of a failed test. Built on `coord-tools`' ensemble (shared with the demo),
//!   plus TLS, joining replicas and the network proxies of [`chaos::netproxy`] (a leaf of
//!   `chaos`, below `cluster`; the rest of `chaos` runs over `cluster`).
//! - [`chaos`]: fault injection (crashes, pauses, partitions from a seeded schedule), histories and
//!   their checkers (linearizability, barriers, lost writes).
//! - [`coord_suite`]: the coordination service's behaviour suite, run against 1- and 3-replica
//!   ensembles.
//! - [`jax`]: the real jaxlib client in a venv, its test scripts, and coord-proxy sidecars.
//! - [`tfdata`]: TensorFlow's own tf.data service in a venv, the peer coord-bench measures
//!   coord's dispatcher against.
//! - [`tf`]: unmodified TensorFlow MultiWorkerMirroredStrategy workers pointed at the ensemble.
//! - [`tf_service`]: real TensorFlow tf.data service processes (TF's dispatcher, workers, readers)
//!   pointed at any dispatcher address, for the dispatcher tests that compare TF's and coord's;
//!   [`tfdata_conformance`]: the scenarios those tests run on both, and their checks.
//! - [`tcpstore_client`]: a client of torch's TCPStore wire (coord-bench's simulated ranks).
//! - [`torch`]: real torch in a venv, its test scripts, and coord-proxy sidecars serving its store;
//!   [`torchrun`]: a running torchrun (or torch script) whose output lines a test follows.
//! - [`bench`]: coord-bench's load generators, failover measurement, its targets (coord and
//!   etcd 3.4), and each subcommand's runner (the binary is only the command line).

pub mod bench;
pub mod certs;
pub mod chaos;
pub mod cli;
pub mod cluster;
pub mod compose;
pub mod coord_suite;
pub mod data;
pub mod jax;
pub mod jax_failover;
pub mod link;
pub mod tcpstore_client;
pub mod tf;
pub mod tf_conformance;
pub mod tf_service;
pub mod tfdata;
pub mod tfdata_conformance;
pub mod torch;
pub mod torchrun;
pub mod venv;

pub use cluster::{Cluster, ClusterOptions};
pub use coord_tools::http;

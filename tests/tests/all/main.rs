//! coord-tests' integration tests, one module an area, in one test binary.
//!
//! One binary rather than one per area: cargo runs test binaries one after another, so a binary
//! whose last test waited on a venv download or the images' release build held the machine's
//! other test thread idle, and each binary linked the whole dependency tree again. In one binary
//! `cargo test` keeps both of its threads busy across areas. One area at a time:
//! `cargo test -p coord-tests --test all chaos::`.

mod agent;
mod agent_failover;
mod backup;
mod chaos;
mod containers;
mod coordctl;
mod coordination_1;
mod coordination_3;
mod coordination_failover;
mod deploy_k8s;
mod dispatcher;
mod dispatcher_faults;
mod dispatcher_upgrade;
mod handoff;
mod house;
mod jax;
mod kv_cluster;
mod limits;
mod membership;
mod monitoring;
mod namespaces;
mod preemption;
mod quota;
mod raft_log_sled;
mod rendezvous;
mod scale;
mod startup;
mod status_page;
mod tensorflow;
mod tf_schema;
mod tf_wire;
mod tfdata_faults;
mod tfdata_leases;
mod tfdata_wire;
mod tls;
mod torch;
mod torch_elastic;
mod xla_scale;
mod xla_wire;

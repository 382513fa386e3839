//! What a call does on the leader, whichever surface it came through.
//!
//! - [`route`]: runs every call on the leader: locally, or forwarded from a follower, and driven
//!   again, with the same request id, when leadership moves; it binds the call to its
//!   [`namespace`], which every layer below acts in.
//! - [`kv`], [`coordination`], [`dispatcher`]: the semantics, written once for every surface
//!   (the dispatcher's two surfaces, TensorFlow's and coord's, are thin adapters inside it);
//!   [`raw_kv`]: the raw key space (torch's store keys), its limits and its waits.
//! - [`proposer`]: writes batched into Raft entries; [`read_index`]: linearizable reads, batched;
//!   [`write_rate`]: each namespace held to its write rate before its writes are proposed.
//! - [`apply_hub`]: where applied changes reach the server; it wakes [`parked`] calls and records
//!   key changes in the [`watch_hub`].
//! - Leader duties: [`cluster_init`] (the first leader sets the cluster up), [`heartbeats`] (silent
//!   tasks go to ERROR), [`barrier_timer`] (barrier deadlines), [`namespace_ttl`] (idle
//!   namespaces deleted), [`quota`] (its `--quota-bytes`
//!   put in force).

pub mod apply_hub;
pub mod barrier_timer;
pub mod cluster_init;
pub mod coordination;
pub mod dispatcher;
pub mod heartbeats;
pub mod kv;
pub mod namespace;
pub mod namespace_ttl;
pub mod parked;
pub mod proposer;
pub mod quota;
pub mod raw_kv;
pub mod read_index;
pub mod route;
pub mod stall;
pub mod watch_hub;
pub mod write_rate;

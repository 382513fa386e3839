//! coord-bench's building blocks: what a benchmark target must do, closed-loop load, failover
//! measurement, many simulated tasks ([`tasks`]), and the two targets (a coord ensemble and an etcd 3.4 cluster, both real processes
//! on loopback).
//!
//! Each subcommand of coord-bench runs one module here: [`kv`], [`agent_failover`] (`failover`),
//! [`tasks`], [`chaos`], [`crash`], [`dispatcher`], [`rendezvous`], [`rolling`] (graceful rolling
//! restarts against kill -9), [`tfdata`] (TensorFlow's own
//! workers and reader on coord's and TF's dispatchers); [`failover_report`] prints a leader-kill
//! measurement for `kv` and `failover` alike.

pub mod agent_failover;
pub mod agent_target;
pub mod chaos;
pub mod coord_target;
pub mod crash;
pub mod dispatcher;
pub mod etcd;
pub mod failover;
pub mod failover_report;
pub mod kv;
pub mod load;
pub mod rendezvous;
pub mod rolling;
pub mod tasks;
pub mod tfdata;

use std::future::Future;

use bytes::Bytes;

/// A key-value service under benchmark. `conn` picks one of the target's connections; clients are
/// spread over them.
pub trait KvTarget: Send + Sync + 'static {
    /// Writes (overwrites) `key`; retries through failover are the target client's business.
    fn put(
        &self,
        conn: usize,
        key: String,
        value: Bytes,
    ) -> impl Future<Output = Result<(), String>> + Send;
    /// A linearizable read of `key`.
    fn get(&self, conn: usize, key: String) -> impl Future<Output = Result<(), String>> + Send;
    /// How many connections the target holds.
    fn connections(&self) -> usize;
}

/// An ensemble whose leader can be killed and brought back.
pub trait Ensemble {
    /// kill -9 of the current leader; returns its name.
    fn kill_leader(&mut self) -> impl Future<Output = String>;
    /// Restarts what was killed and waits until every member is healthy and caught up.
    fn recover(&mut self) -> impl Future<Output = ()>;
}

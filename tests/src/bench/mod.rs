//! coord-bench's building blocks: what a benchmark target must do, closed-loop load, failover
//! measurement, many simulated tasks ([`tasks`]), and the two targets (a coord ensemble and an etcd 3.4 cluster, both real processes
//! on loopback).
//!
//! Each subcommand of coord-bench runs one module here: [`kv`], [`agent_failover`] (`failover`),
//! [`tasks`], [`chaos`], [`crash`], [`dispatcher`], [`rendezvous`], [`rolling`] (graceful rolling
//! restarts against kill -9), [`tfdata`] (TensorFlow's own
//! workers and reader on coord's and TF's dispatchers), [`torch`] (torch's TCPStore through
//! coord-proxy against torch's own store), [`namespaces`] (many jobs and a noisy one on one
//! ensemble), [`xla_scale`] (a large JAX job on jaxlib's own wire: registration, heartbeats,
//! GetAliveTasks, and the Raft log each writes, read by [`raft_log`]); [`failover_report`]
//! prints a leader-kill measurement for `kv` and `failover` alike.

pub mod agent_failover;
pub mod agent_target;
pub mod chaos;
pub mod conntrack;
pub mod coord_target;
pub mod crash;
pub mod dispatcher;
pub mod etcd;
pub mod failover;
pub mod failover_report;
pub mod kv;
pub mod load;
pub mod namespaces;
pub mod raft_log;
mod readings;
pub mod rendezvous;
pub mod rolling;
pub mod scale;
pub mod tasks;
pub mod tfdata;
pub mod torch;
pub mod wait_for_all;
mod wire_size;
pub mod xla_scale;
mod xla_sidecars;

use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

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

/// The space a directory tree takes: on disk as `du` counts it (allocated blocks, directories
/// included), and the apparent length of its files. Zero for a missing directory; symbolic links
/// are not followed.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskUsage {
    pub on_disk: u64,
    pub apparent: u64,
}

impl std::ops::Add for DiskUsage {
    type Output = Self;

    fn add(self, o: Self) -> Self {
        Self {
            on_disk: self.on_disk + o.on_disk,
            apparent: self.apparent + o.apparent,
        }
    }
}

impl std::iter::Sum for DiskUsage {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| a + b)
    }
}

pub fn disk_usage(p: &Path) -> DiskUsage {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return DiskUsage::default();
    };
    let own = DiskUsage {
        on_disk: m.blocks() * 512,
        apparent: if m.is_file() { m.len() } else { 0 },
    };
    if !m.is_dir() {
        return own;
    }
    let Ok(rd) = std::fs::read_dir(p) else {
        return own;
    };
    own + rd.flatten().map(|e| disk_usage(&e.path())).sum()
}

/// Bytes as megabytes, one decimal.
pub fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

//! An ensemble of real `coordinator` processes on this machine: the replica table (ids, loopback
//! addresses, data directories, logs, child processes) and what can be done to a replica's process
//! (start with given flags, kill -9, SIGTERM with a grace period, SIGSTOP/SIGCONT, wait for it to
//! exit), with polls of `/status` (a leader everyone agrees on, an applied index).
//!
//! The invariant it keeps: every process it started dies with it. Dropping a [`LocalEnsemble`]
//! kills every replica, also when its owner panics; a panic keeps the directory (data and each
//! replica's log) and prints where it is, with the end of every log, so that a failed run can be
//! read afterwards.
//!
//! `coord-demo`'s ensemble and the multi-process tests' `Cluster` are both built on this, so a
//! demo and a test start, stop and watch replicas the same way. What flags a replica runs with is
//! theirs to decide (the tests add TLS, proxies and `--peer-source-ip`); this module supplies the
//! flags every replica needs ([`LocalEnsemble::base_args`]).

use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::process::{coordinator_binary, free_ports, send_signal};
use crate::status::{self, StatusView};

/// The replicas' `RUST_LOG` unless their owner picks another.
pub const DEFAULT_LOG_FILTER: &str = "info,openraft=warn,h2=warn";

/// How often the `wait_*` polls look again.
const POLL: Duration = Duration::from_millis(20);

/// How many lines of each replica's log a panic prints.
const LOG_TAIL_LINES: usize = 25;

/// How a new [`LocalEnsemble`] is laid out.
#[derive(Clone, Debug)]
pub struct Layout {
    /// How many replicas (ids `1..=replicas`).
    pub replicas: usize,
    /// Give every replica a peer address of its own, where the other replicas reach it (in
    /// `--initial-cluster`), for something the owner puts between them (the tests' network
    /// proxies). Otherwise the other replicas dial its gRPC address.
    pub separate_peer_addrs: bool,
    /// `RUST_LOG` for the replicas.
    pub log_filter: String,
    /// What a panic prints before the kept directory's path, e.g. `test failed; cluster data and
    /// logs`.
    pub failure_banner: &'static str,
}

/// One replica of a [`LocalEnsemble`]: where it listens, where its files are, and its process.
pub struct ReplicaProc {
    pub id: u64,
    /// Where the replica listens (and clients connect).
    pub grpc: SocketAddr,
    /// Where the other replicas reach it (see [`Layout::separate_peer_addrs`]).
    pub peer: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    /// Started with `--join` (added to a running ensemble, not one of the initial replicas).
    pub joining: bool,
    /// Private, so that only this module starts and reaps processes (and no one outside can make
    /// a replica the table does not own).
    child: Option<Child>,
}

pub struct LocalEnsemble {
    /// `None` once kept (by [`LocalEnsemble::persist`] or after a panic).
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    /// Public so that callers can walk the replicas' addresses; processes are reached only
    /// through the methods.
    pub replicas: Vec<ReplicaProc>,
    initial_cluster: String,
    layout: Layout,
}

impl LocalEnsemble {
    /// Picks free ports and makes a temp dir for the replicas of `layout`; starts none of them.
    pub fn new(layout: Layout) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("coord-cluster-")
            .tempdir()
            .expect("temp dir");
        let root = dir.path().to_path_buf();
        let mut e = Self {
            dir: Some(dir),
            root,
            replicas: Vec::with_capacity(layout.replicas),
            initial_cluster: String::new(),
            layout,
        };
        for id in 1..=e.layout.replicas as u64 {
            let r = e.new_replica(id, false);
            e.replicas.push(r);
        }
        e.initial_cluster = initial_cluster_of(&e.replicas);
        e
    }

    /// Like [`LocalEnsemble::new`], but replica `i + 1` listens on `addresses[i]` (gRPC, HTTP):
    /// for data directories made elsewhere, which name the addresses of their ensemble.
    pub fn at(layout: Layout, addresses: &[(SocketAddr, SocketAddr)]) -> Self {
        let mut e = Self::new(Layout {
            replicas: addresses.len(),
            separate_peer_addrs: false,
            ..layout
        });
        for (r, (grpc, http)) in e.replicas.iter_mut().zip(addresses) {
            (r.grpc, r.peer, r.http) = (*grpc, *grpc, *http);
        }
        e.initial_cluster = initial_cluster_of(&e.replicas);
        e
    }

    /// Replica `id` on free ports, with its files under the ensemble's directory.
    fn new_replica(&self, id: u64, joining: bool) -> ReplicaProc {
        let ports = free_ports(if self.layout.separate_peer_addrs {
            3
        } else {
            2
        });
        let grpc = SocketAddr::from(([127, 0, 0, 1], ports[0]));
        ReplicaProc {
            id,
            grpc,
            peer: ports
                .get(2)
                .map_or(grpc, |&p| SocketAddr::from(([127, 0, 0, 1], p))),
            http: SocketAddr::from(([127, 0, 0, 1], ports[1])),
            data_dir: self.root.join(format!("data-{id}")),
            log_path: self.root.join(format!("replica-{id}.log")),
            joining,
            child: None,
        }
    }

    /// Adds a replica (the next unused id) that starts with `--join`, for `member add`; does not
    /// start it. Returns its id.
    pub fn add_joining(&mut self) -> u64 {
        let id = self.ids().into_iter().max().unwrap_or(0) + 1;
        let r = self.new_replica(id, true);
        self.replicas.push(r);
        id
    }

    pub fn ids(&self) -> Vec<u64> {
        self.replicas.iter().map(|r| r.id).collect()
    }

    /// The ensemble's directory (data, logs; owners put their own files here too).
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    pub fn replica(&self, id: u64) -> &ReplicaProc {
        self.replicas
            .iter()
            .find(|r| r.id == id)
            .expect("no such replica")
    }

    fn replica_mut(&mut self, id: u64) -> &mut ReplicaProc {
        self.replicas
            .iter_mut()
            .find(|r| r.id == id)
            .expect("no such replica")
    }

    /// gRPC addresses of every replica.
    pub fn endpoints(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.grpc.to_string()).collect()
    }

    /// The flags every replica of this ensemble needs: its id, addresses and data directory, the
    /// initial cluster, and `--join` for a joining replica.
    pub fn base_args(&self, id: u64) -> Vec<String> {
        let r = self.replica(id);
        let mut args = vec![
            "--id".to_string(),
            id.to_string(),
            "--listen".into(),
            r.grpc.to_string(),
            "--http-listen".into(),
            r.http.to_string(),
            "--initial-cluster".into(),
            self.initial_cluster.clone(),
            "--data-dir".into(),
            r.data_dir.display().to_string(),
        ];
        if r.joining {
            args.push("--join".into());
        }
        args
    }

    /// Starts replica `id` with exactly `args`; its output goes to its log file.
    pub fn spawn_with(&mut self, id: u64, args: &[String]) {
        let filter = self.layout.log_filter.clone();
        let r = self.replica_mut(id);
        assert!(r.child.is_none(), "replica {id} is already running");
        let log = open_log(&r.log_path);
        let child = Command::new(coordinator_binary())
            .args(args)
            .env("RUST_LOG", filter)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn coordinator");
        r.child = Some(child);
    }

    /// kill -9.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut c) = self.replica_mut(id).child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for the process to exit; kill -9 after `grace`. Returns the exit code
    /// if it exited by itself in time.
    pub fn terminate(&mut self, id: u64, grace: Duration) -> Option<i32> {
        let mut c = self.replica_mut(id).child.take()?;
        send_signal(i64::from(c.id()), "TERM");
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = c.try_wait() {
                return status.code();
            }
            std::thread::sleep(POLL);
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// SIGSTOP: the replica freezes (a stalled VM, a GC pause) but keeps its sockets.
    pub fn pause(&self, id: u64) {
        self.signal(id, "STOP");
    }

    /// SIGCONT after [`LocalEnsemble::pause`].
    pub fn resume(&self, id: u64) {
        self.signal(id, "CONT");
    }

    fn signal(&self, id: u64, sig: &str) {
        if let Some(pid) = self.pid(id) {
            send_signal(i64::from(pid), sig);
        }
    }

    /// Keeps the ensemble's directory (data, logs) after the ensemble is dropped; returns it.
    pub fn persist(&mut self) -> PathBuf {
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        self.root.clone()
    }

    /// The process id of replica `id`, if it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.replica(id).child.as_ref().map(Child::id)
    }

    /// Whether replica `id`'s process is alive; reaps it if it exited.
    pub fn is_running(&mut self, id: u64) -> bool {
        let r = self.replica_mut(id);
        match &mut r.child {
            None => false,
            Some(c) => match c.try_wait() {
                Ok(None) => true,
                _ => {
                    r.child = None;
                    false
                }
            },
        }
    }

    /// Waits for replica `id` to exit by itself and returns its exit code.
    pub fn wait_exit(&mut self, id: u64, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        let r = self.replica_mut(id);
        let c = r.child.as_mut()?;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = c.try_wait() {
                r.child = None;
                return status.code();
            }
            std::thread::sleep(POLL);
        }
        None
    }

    /// Everything replica `id` has logged so far (all its runs).
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.replica(id).log_path).unwrap_or_default()
    }

    /// Replica `id`'s `/status`, if it answers.
    pub fn status(&self, id: u64) -> Option<StatusView> {
        status::status(self.replica(id).http)
    }

    /// The `/status` of every running replica (`None`: it did not answer).
    pub fn statuses(&mut self) -> Vec<(u64, Option<StatusView>)> {
        let ids: Vec<u64> = self
            .ids()
            .into_iter()
            .filter(|&id| self.is_running(id))
            .collect();
        ids.into_iter().map(|id| (id, self.status(id))).collect()
    }

    /// Waits until every running replica reports the same leader, which reports itself leader;
    /// returns its id.
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let statuses = self.statuses();
            if let Some(leader) = status::agreed_leader(&statuses) {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {timeout:?}; statuses: {statuses:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until replica `id` answers `/status` (its process is up and serving).
    pub async fn wait_serving(&mut self, id: u64, timeout: Duration) {
        poll_until(timeout, &format!("replica {id} to serve"), || {
            self.status(id).is_some()
        })
        .await;
    }

    /// Waits until replica `id` has applied at least `index`.
    pub async fn wait_applied(&mut self, id: u64, index: u64, timeout: Duration) {
        poll_until(
            timeout,
            &format!("replica {id} to apply index {index}"),
            || self.status(id).is_some_and(|s| s.last_applied >= index),
        )
        .await;
    }
}

/// Waits until `cond` holds, polling; panics with `what` after `timeout`. The loop behind every
/// wait here and the owners' `wait_until`s: an owner that wraps a [`LocalEnsemble`] hands its
/// conditions itself (with its extras), not the ensemble, so the ensemble offers the loop rather
/// than a `wait_until` of its own.
pub async fn poll_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// `--initial-cluster` naming every replica by its peer address.
fn initial_cluster_of(replicas: &[ReplicaProc]) -> String {
    replicas
        .iter()
        .map(|r| format!("{}={}", r.id, r.peer))
        .collect::<Vec<_>>()
        .join(",")
}

fn open_log(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open replica log")
}

impl Drop for LocalEnsemble {
    fn drop(&mut self) {
        for id in self.ids() {
            self.kill(id);
        }
        if !std::thread::panicking() {
            return;
        }
        if let Some(dir) = self.dir.take() {
            let kept = dir.keep();
            eprintln!(
                "\n=== {} kept in {} ===",
                self.layout.failure_banner,
                kept.display()
            );
            for r in &self.replicas {
                let log = std::fs::read_to_string(&r.log_path).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
                eprintln!(
                    "--- replica {} (last {} lines) ---\n{}",
                    r.id,
                    tail.len(),
                    tail.join("\n")
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(separate_peer_addrs: bool) -> Layout {
        Layout {
            replicas: 3,
            separate_peer_addrs,
            log_filter: DEFAULT_LOG_FILTER.into(),
            failure_banner: "unit test failed; ensemble data and logs",
        }
    }

    #[test]
    fn the_table_names_every_replica_in_the_initial_cluster_by_its_peer_address() {
        for separate in [false, true] {
            let e = LocalEnsemble::new(layout(separate));
            assert_eq!(e.ids(), [1, 2, 3]);
            let expected: Vec<String> = e
                .replicas
                .iter()
                .map(|r| format!("{}={}", r.id, r.peer))
                .collect();
            assert_eq!(e.initial_cluster(), expected.join(","));
            for r in &e.replicas {
                assert_eq!(r.peer == r.grpc, !separate);
                assert!(r.data_dir.starts_with(e.root()) && r.log_path.starts_with(e.root()));
            }
            let args = e.base_args(2);
            assert_eq!(args[..2], ["--id", "2"]);
            assert!(args.contains(&e.initial_cluster().to_string()));
            assert!(!args.contains(&"--join".to_string()));
        }
    }

    #[test]
    fn a_joining_replica_gets_the_next_id_and_joins() {
        let mut e = LocalEnsemble::new(layout(false));
        let id = e.add_joining();
        assert_eq!(id, 4);
        assert!(e.replica(id).joining);
        assert_eq!(e.base_args(id).last().map(String::as_str), Some("--join"));
        assert!(!e.is_running(id));
        assert_eq!(e.pid(id), None);
    }

    #[test]
    fn the_directory_goes_with_the_ensemble_unless_persisted() {
        let e = LocalEnsemble::new(layout(false));
        let root = e.root().to_path_buf();
        drop(e);
        assert!(!root.exists());
        let mut e = LocalEnsemble::new(layout(false));
        let kept = e.persist();
        drop(e);
        assert!(kept.is_dir());
        std::fs::remove_dir_all(kept).expect("remove the kept directory");
    }
}

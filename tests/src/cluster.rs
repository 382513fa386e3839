//! A coord ensemble of real `coordinator` processes on loopback, for tests and benchmarks.
//!
//! Ports are picked free, data lives in a temp dir, and every process the cluster started is
//! killed when it is dropped — also when the test fails. A failed test keeps the directory (data
//! and each replica's log) and prints where it is, with the end of every log.

use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use crate::chaos::netproxy::{source_ip, NetProxy};
use crate::http;

/// What `/status` says (the fields tests look at).
#[derive(Debug, Clone, Deserialize)]
pub struct StatusView {
    pub id: u64,
    pub leader_id: Option<u64>,
    pub state: String,
    pub term: u64,
    pub last_log_index: u64,
    pub last_applied: u64,
    /// The last index the latest snapshot covers.
    #[serde(default)]
    pub snapshot_index: u64,
    /// The last index purged from the log (everything up to it is only in the snapshot).
    #[serde(default)]
    pub purged_index: u64,
}

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub replicas: usize,
    /// Extra flags for every replica.
    pub extra_args: Vec<String>,
    /// `RUST_LOG` for the replicas.
    pub log_filter: String,
    /// Put a [`NetProxy`] between the replicas so that tests can cut links.
    pub proxied: bool,
    /// Serve TLS: a test CA and replica certificates are made in the cluster's directory (see
    /// [`Cluster::pki`]).
    pub tls: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            replicas: 3,
            extra_args: Vec::new(),
            log_filter: "info,openraft=warn,h2=warn".into(),
            proxied: false,
            tls: false,
        }
    }
}

pub struct ReplicaProc {
    pub id: u64,
    /// Where the replica listens (and clients connect).
    pub grpc: SocketAddr,
    /// Where the other replicas reach it (its proxy, when the cluster is proxied).
    pub peer: SocketAddr,
    pub http: SocketAddr,
    pub data_dir: PathBuf,
    pub log_path: PathBuf,
    /// Started with `--join` (added to a running ensemble, not one of the initial replicas).
    pub joining: bool,
    child: Option<Child>,
}

pub struct Cluster {
    dir: Option<tempfile::TempDir>,
    root: PathBuf,
    pub replicas: Vec<ReplicaProc>,
    initial_cluster: String,
    options: ClusterOptions,
    proxy: Option<NetProxy>,
    pki: Option<crate::certs::TestPki>,
}

/// The `coordinator` binary of this workspace, built if needed (once per test process).
/// `COORD_BIN` overrides it.
pub fn coordinator_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_binary("coord-server", "coordinator", Some("COORD_BIN")))
        .clone()
}

/// `target/<profile>` of the running test binary.
pub fn profile_dir() -> PathBuf {
    // target/<profile>/deps/<test binary> → target/<profile>
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Binary `bin` of workspace package `package`, built with cargo in the profile of the running
/// test (a test cannot name another package's binary through `CARGO_BIN_EXE_*`). The environment
/// variable `env_override`, if given and set, names a binary to use instead.
/// Sends signal `sig` (`TERM`, `STOP`, `KILL`, …) to process `target`, or to process group `-target`
/// when `target` is negative.
///
/// Always `kill -s SIG -- TARGET`: procps-ng 4.0's `kill -KILL -12345` reads the group id's first
/// digit as part of an option and calls `kill(-1, SIGKILL)`, which kills every process on the
/// machine (seen with strace: `kill -0 -12345` calls `kill(-1, 0)`).
pub fn send_signal(target: i64, sig: &str) {
    let _ = Command::new("kill")
        .args(["-s", sig, "--", &target.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

pub fn workspace_binary(package: &str, bin: &str, env_override: Option<&str>) -> PathBuf {
    if let Some(p) = env_override.and_then(|v| std::env::var(v).ok()) {
        return PathBuf::from(p);
    }
    // Built once per test process.
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, p)) = built.iter().find(|(b, _)| b == bin) {
        return p.clone();
    }
    let profile_dir = profile_dir();
    let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
    let release = profile_dir.ends_with("release");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(workspace)
        .args([
            "build",
            "--quiet",
            "-p",
            package,
            "--bin",
            bin,
            "--target-dir",
        ])
        .arg(&target_dir);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for the {bin} binary: {e}"));
    assert!(status.success(), "building the {bin} binary failed");
    let path = profile_dir.join(bin);
    built.push((bin.to_string(), path.clone()));
    path
}

/// `n` distinct free loopback ports for servers the test starts.
///
/// They come from below the kernel's ephemeral range (`ip_local_port_range`), never from it:
/// a port from `bind(0)` is free only until the server binds it, and meanwhile any outgoing
/// connection on the machine (other tests, other ensembles) may take it as its local port, so
/// the server fails to start or, worse, the test talks to someone else's server. Ports handed out
/// in this process are not handed out again; other processes pick at random, so they rarely meet.
pub fn free_ports(n: usize) -> Vec<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let (low, high) = port_range_below_ephemeral();
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut picked: Vec<(u16, TcpListener)> = Vec::with_capacity(n);
    let mut tries = 0;
    while picked.len() < n {
        tries += 1;
        assert!(tries < 100_000, "no free port in {low}..{high}");
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), low..high);
        if given.contains(&port) || picked.iter().any(|(p, _)| *p == port) {
            continue;
        }
        // Held open while picking, so the ports differ; a port in use is skipped.
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            picked.push((port, l));
        }
    }
    let ports: Vec<u16> = picked.into_iter().map(|(p, _)| p).collect();
    given.extend(&ports);
    ports
}

/// Ports 10000 up to the start of the ephemeral range (32768 by default).
fn port_range_below_ephemeral() -> (u16, u16) {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (10_000, start.max(10_100))
}

impl Cluster {
    /// Starts an ensemble and returns without waiting for a leader.
    pub fn start(options: ClusterOptions) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("coord-cluster-")
            .tempdir()
            .expect("temp dir");
        let root = dir.path().to_path_buf();
        // A port can be taken by another process between picking and binding; the proxies bind
        // here, so a clash is retried with new ports (the replicas' own ports are bound by the
        // replicas, which fail loudly).
        let mut attempt = 0;
        let (replicas, initial_cluster, proxy) = loop {
            attempt += 1;
            let (replicas, initial_cluster) = Self::layout(&options, &root);
            if !options.proxied {
                break (replicas, initial_cluster, None);
            }
            let targets: Vec<_> = replicas.iter().map(|r| (r.id, r.peer, r.grpc)).collect();
            match NetProxy::start(&targets) {
                Ok(p) => break (replicas, initial_cluster, Some(p)),
                Err(e) if attempt < 5 => eprintln!("start the network proxies: {e}; new ports"),
                Err(e) => panic!("start the network proxies: {e}"),
            }
        };
        let pki = options.tls.then(|| {
            let ids: Vec<u64> = replicas.iter().map(|r| r.id).collect();
            crate::certs::TestPki::new(&root.join("certs"), "coord", &ids)
        });
        let mut c = Self {
            dir: Some(dir),
            root,
            replicas,
            initial_cluster,
            options,
            proxy,
            pki,
        };
        for id in c.ids() {
            c.spawn(id);
        }
        c
    }

    /// Ports, directories and the `--initial-cluster` of a new ensemble under `root`.
    fn layout(options: &ClusterOptions, root: &Path) -> (Vec<ReplicaProc>, String) {
        let ports = free_ports(options.replicas * 3);
        let replicas: Vec<ReplicaProc> = (0..options.replicas)
            .map(|i| {
                let id = i as u64 + 1;
                let grpc = SocketAddr::from(([127, 0, 0, 1], ports[3 * i]));
                ReplicaProc {
                    id,
                    grpc,
                    peer: if options.proxied {
                        SocketAddr::from(([127, 0, 0, 1], ports[3 * i + 2]))
                    } else {
                        grpc
                    },
                    http: SocketAddr::from(([127, 0, 0, 1], ports[3 * i + 1])),
                    data_dir: root.join(format!("data-{id}")),
                    log_path: root.join(format!("replica-{id}.log")),
                    joining: false,
                    child: None,
                }
            })
            .collect();
        let initial_cluster = replicas
            .iter()
            .map(|r| format!("{}={}", r.id, r.peer))
            .collect::<Vec<_>>()
            .join(",");
        (replicas, initial_cluster)
    }

    /// Waits until replica `id` answers `/status` (its process is up and serving).
    pub async fn wait_serving(&mut self, id: u64, timeout: Duration) {
        self.wait_until(timeout, &format!("replica {id} to serve"), |c| {
            c.status(id).is_some()
        })
        .await;
    }

    /// Starts a new replica with `--join` (the next unused id), for `member add`; returns its id.
    pub fn start_joining(&mut self) -> u64 {
        assert!(
            !self.options.proxied,
            "joining replicas are not proxied; start the cluster without proxies"
        );
        let id = self.ids().into_iter().max().unwrap_or(0) + 1;
        let ports = free_ports(2);
        let grpc = SocketAddr::from(([127, 0, 0, 1], ports[0]));
        self.replicas.push(ReplicaProc {
            id,
            grpc,
            peer: grpc,
            http: SocketAddr::from(([127, 0, 0, 1], ports[1])),
            data_dir: self.root.join(format!("data-{id}")),
            log_path: self.root.join(format!("replica-{id}.log")),
            joining: true,
            child: None,
        });
        if let Some(pki) = &self.pki {
            pki.issue(&pki.replica(id));
        }
        self.spawn(id);
        id
    }

    pub fn ids(&self) -> Vec<u64> {
        self.replicas.iter().map(|r| r.id).collect()
    }

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

    /// Some replica other than `id` (e.g. a follower, given the leader).
    pub fn other_than(&self, id: u64) -> u64 {
        self.ids()
            .into_iter()
            .find(|&i| i != id)
            .expect("another replica")
    }

    /// gRPC addresses of every replica.
    pub fn endpoints(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.grpc.to_string()).collect()
    }

    /// The flags replica `id` runs with.
    pub fn args_of(&self, id: u64) -> Vec<String> {
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
        if self.options.proxied {
            args.extend(["--peer-source-ip".into(), source_ip(id).to_string()]);
        }
        if r.joining {
            args.push("--join".into());
        }
        if let Some(pki) = &self.pki {
            args.extend(pki.replica_args(id));
        }
        args.extend(self.options.extra_args.iter().cloned());
        args
    }

    /// The certificates of a TLS cluster.
    pub fn pki(&self) -> &crate::certs::TestPki {
        self.pki
            .as_ref()
            .expect("the cluster was started without TLS")
    }

    /// The network between the replicas (only for a proxied cluster).
    pub fn net(&self) -> &NetProxy {
        self.proxy
            .as_ref()
            .expect("the cluster was started without proxies")
    }

    /// Starts (or restarts) replica `id` with its usual flags; its output goes to its log file.
    pub fn spawn(&mut self, id: u64) {
        let args = self.args_of(id);
        self.spawn_with(id, &args);
    }

    /// Starts replica `id` with exactly `args`.
    pub fn spawn_with(&mut self, id: u64, args: &[String]) {
        let filter = self.options.log_filter.clone();
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
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// SIGSTOP: the replica freezes (a stalled VM, a GC pause) but keeps its sockets.
    pub fn pause(&self, id: u64) {
        self.signal(id, "STOP");
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&self, id: u64) {
        self.signal(id, "CONT");
    }

    fn signal(&self, id: u64, sig: &str) {
        if let Some(pid) = self.pid(id) {
            send_signal(i64::from(pid), sig);
        }
    }

    /// Keeps the cluster's directory (data, logs) after the cluster is dropped; returns it.
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
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.replica(id).log_path).unwrap_or_default()
    }

    /// Replica `id`'s `/status`, if it answers.
    pub fn status(&self, id: u64) -> Option<StatusView> {
        let (code, body) = http::get(self.replica(id).http, "/status").ok()?;
        if code != 200 {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// The value of metric `name` (a sample without labels) on replica `id`.
    pub fn metric(&self, id: u64, name: &str) -> f64 {
        let (_, body) = http::get(self.replica(id).http, "/metrics").expect("GET /metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing from replica {id}"))
    }

    /// Waits until every running replica reports the same leader, which reports itself leader;
    /// returns its id.
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.agreed_leader() {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {timeout:?}; statuses: {:?}",
                self.statuses()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn statuses(&mut self) -> Vec<(u64, Option<StatusView>)> {
        let ids: Vec<u64> = self
            .ids()
            .into_iter()
            .filter(|&id| self.is_running(id))
            .collect();
        ids.into_iter().map(|id| (id, self.status(id))).collect()
    }

    fn agreed_leader(&mut self) -> Option<u64> {
        let statuses = self.statuses();
        let first = statuses.first()?.1.as_ref()?.leader_id?;
        let all_agree = statuses
            .iter()
            .all(|(_, s)| s.as_ref().and_then(|s| s.leader_id) == Some(first));
        let leader_says_so = statuses
            .iter()
            .any(|(id, s)| *id == first && s.as_ref().is_some_and(|s| s.state == "Leader"));
        (all_agree && leader_says_so).then_some(first)
    }

    /// Waits until `f` holds, polling; panics with `what` after `timeout`.
    pub async fn wait_until(
        &mut self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&mut Self) -> bool,
    ) {
        let deadline = Instant::now() + timeout;
        while !f(self) {
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until replica `id` has applied at least `index`.
    pub async fn wait_applied(&mut self, id: u64, index: u64, timeout: Duration) {
        self.wait_until(
            timeout,
            &format!("replica {id} to apply index {index}"),
            |c| c.status(id).is_some_and(|s| s.last_applied >= index),
        )
        .await;
    }
}

fn open_log(path: &Path) -> File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open replica log")
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in self.ids() {
            self.kill(id);
        }
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!(
                    "\n=== test failed; cluster data and logs kept in {} ===",
                    kept.display()
                );
                for r in &self.replicas {
                    let log = std::fs::read_to_string(&r.log_path).unwrap_or_default();
                    let lines: Vec<&str> = log.lines().collect();
                    let tail = &lines[lines.len().saturating_sub(25)..];
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
}

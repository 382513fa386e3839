//! A coord ensemble of real `coordinator` processes on loopback, for tests and benchmarks.
//!
//! Ports are picked free, data lives in a temp dir, and every process the cluster started is
//! killed when it is dropped — also when the test fails. A failed test keeps the directory (data
//! and each replica's log) and prints where it is, with the end of every log.
//!
//! The process table and everything done to a replica's process (spawn, kill, signals, `/status`
//! polls, the drop guard) is `coord-tools`' [`LocalEnsemble`], shared with `coord-demo`; a
//! [`Cluster`] derefs to it and adds only what tests need: network proxies between the replicas,
//! TLS, joining replicas, the flags that go with them, and `/metrics`.

use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use coord_tools::ensemble::{poll_until, Layout, LocalEnsemble, DEFAULT_LOG_FILTER};

use crate::chaos::netproxy::{source_ip, NetProxy};
use crate::http;

// Finding binaries, picking ports, signals, `/status` and the replica table are shared with
// `coord-demo`'s ensemble; these paths stay for the tests.
pub use coord_tools::ensemble::ReplicaProc;
pub use coord_tools::process::{
    coordinator_binary, free_ports, profile_dir, send_signal, workspace_binary,
};
pub use coord_tools::status::StatusView;

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
            log_filter: DEFAULT_LOG_FILTER.into(),
            proxied: false,
            tls: false,
        }
    }
}

/// A [`LocalEnsemble`] with the tests' extras. It derefs to the ensemble, so the process
/// operations (`kill`, `terminate`, `pause`, `status`, `wait_for_leader`, …) and the `replicas`
/// table are called on the cluster directly.
pub struct Cluster {
    /// First, so that the replicas are killed before their proxies stop.
    ensemble: LocalEnsemble,
    options: ClusterOptions,
    proxy: Option<NetProxy>,
    pki: Option<crate::certs::TestPki>,
}

impl Cluster {
    /// Starts an ensemble and returns without waiting for a leader.
    pub fn start(options: ClusterOptions) -> Self {
        let layout = Layout {
            replicas: options.replicas,
            separate_peer_addrs: options.proxied,
            log_filter: options.log_filter.clone(),
            failure_banner: "test failed; cluster data and logs",
        };
        // A port can be taken by another process between picking and binding; the proxies bind
        // here, so a clash is retried with new ports (the replicas' own ports are bound by the
        // replicas, which fail loudly).
        let mut attempt = 0;
        let (ensemble, proxy) = loop {
            attempt += 1;
            let ensemble = LocalEnsemble::new(layout.clone());
            if !options.proxied {
                break (ensemble, None);
            }
            let targets: Vec<_> = ensemble
                .replicas
                .iter()
                .map(|r| (r.id, r.peer, r.grpc))
                .collect();
            match NetProxy::start(&targets) {
                Ok(p) => break (ensemble, Some(p)),
                Err(e) if attempt < 5 => eprintln!("start the network proxies: {e}; new ports"),
                Err(e) => panic!("start the network proxies: {e}"),
            }
        };
        let pki = options.tls.then(|| {
            crate::certs::TestPki::new(&ensemble.root().join("certs"), "coord", &ensemble.ids())
        });
        let mut c = Self {
            ensemble,
            options,
            proxy,
            pki,
        };
        for id in c.ids() {
            c.spawn(id);
        }
        c
    }

    /// An ensemble at fixed addresses (gRPC, HTTP), none of it started: for data directories
    /// made elsewhere (they name their ensemble's addresses), copied into each replica's
    /// `data_dir` before [`Cluster::spawn`].
    pub fn at(options: ClusterOptions, addresses: &[(SocketAddr, SocketAddr)]) -> Self {
        let layout = Layout {
            replicas: addresses.len(),
            separate_peer_addrs: false,
            log_filter: options.log_filter.clone(),
            failure_banner: "test failed; cluster data and logs",
        };
        Self {
            ensemble: LocalEnsemble::at(layout, addresses),
            options,
            proxy: None,
            pki: None,
        }
    }

    /// Starts a new replica with `--join` (the next unused id), for `member add`; returns its id.
    pub fn start_joining(&mut self) -> u64 {
        assert!(
            !self.options.proxied,
            "joining replicas are not proxied; start the cluster without proxies"
        );
        let id = self.ensemble.add_joining();
        if let Some(pki) = &self.pki {
            pki.issue(&pki.replica(id));
        }
        self.spawn(id);
        id
    }

    /// Some replica other than `id` (e.g. a follower, given the leader).
    pub fn other_than(&self, id: u64) -> u64 {
        self.ids()
            .into_iter()
            .find(|&i| i != id)
            .expect("another replica")
    }

    /// The flags replica `id` runs with.
    pub fn args_of(&self, id: u64) -> Vec<String> {
        let mut args = self.ensemble.base_args(id);
        if self.options.proxied {
            args.extend(["--peer-source-ip".into(), source_ip(id).to_string()]);
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
        self.ensemble.spawn_with(id, &args);
    }

    /// Starts replica `id` with `args` and expects it to refuse: a non-zero exit within
    /// `timeout`, its log saying `needle`, and no panic.
    pub fn expect_refusal(&mut self, id: u64, args: &[String], needle: &str, timeout: Duration) {
        let before = self.log(id).len();
        self.spawn_with(id, args);
        let code = self.wait_exit(id, timeout);
        let log = self.log(id)[before..].to_string();
        assert!(
            matches!(code, Some(c) if c != 0),
            "replica {id} did not refuse to start (exit {code:?}); log:\n{log}"
        );
        assert!(
            log.contains(needle),
            "refusal should say {needle:?}; log:\n{log}"
        );
        assert!(
            !log.contains("panicked"),
            "refusal must not be a panic; log:\n{log}"
        );
    }

    /// Keeps the ensemble's directory (data, each replica's log) after it is dropped; returns it.
    pub fn persist(&mut self) -> std::path::PathBuf {
        self.ensemble.persist()
    }

    /// The value of metric `name` (a sample without labels) on replica `id`.
    pub fn metric(&self, id: u64, name: &str) -> f64 {
        let (_, body) = http::get(self.replica(id).http, "/metrics").expect("GET /metrics");
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("metric {name} missing from replica {id}"))
    }

    /// Waits until `f` holds, polling; panics with `what` after `timeout`. `f` gets the whole
    /// cluster (its metrics, its network), not just the ensemble.
    pub async fn wait_until(
        &mut self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&mut Self) -> bool,
    ) {
        poll_until(timeout, what, || f(self)).await;
    }

    /// The state bytes every replica reports in `/status`, once all of them applied the same
    /// state (within `timeout`).
    pub async fn settled_state_bytes(&mut self, timeout: Duration) -> u64 {
        let read = |c: &Cluster| -> Vec<(u64, u64)> {
            c.replicas
                .iter()
                .filter_map(|r| {
                    let (_, body) = http::get(r.http, "/status").ok()?;
                    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
                    Some((v["last_applied"].as_u64()?, v["state_bytes"].as_u64()?))
                })
                .collect()
        };
        let n = self.replicas.len();
        self.wait_until(timeout, "every replica at the same state", |c| {
            let v = read(c);
            v.len() == n && v.iter().all(|x| *x == v[0])
        })
        .await;
        read(self)[0].1
    }
}

impl Deref for Cluster {
    type Target = LocalEnsemble;

    fn deref(&self) -> &LocalEnsemble {
        &self.ensemble
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut LocalEnsemble {
        &mut self.ensemble
    }
}

/// Waits until a load's counter of done operations reaches `at_least`; panics past `timeout`
/// saying the load stalled (the load tests' progress check across a kill).
pub async fn wait_for_count(
    count: &std::sync::atomic::AtomicU64,
    at_least: u64,
    timeout: Duration,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    while count.load(std::sync::atomic::Ordering::Relaxed) < at_least {
        assert!(
            tokio::time::Instant::now() < deadline,
            "load stalled below {at_least} operations"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

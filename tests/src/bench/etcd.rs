//! etcd 3.4 (Debian's `etcd-server`) as the benchmark's anchor: a 3-member cluster of real etcd
//! processes on loopback, and a client that fails over between members like coord's does.
//!
//! A cluster may serve mutual TLS on its client and peer ports ([`EtcdCluster::start_tls`]), so
//! that coord over TLS is measured against etcd paying the same handshakes and encryption.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coord_proto::tls::ClientTls;
use coord_tools::certs::LeafFiles;
use tonic::transport::{Channel, Endpoint};

use super::{Ensemble, KvTarget};
use crate::certs::TestPki;
use crate::cluster::free_ports;

const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

pub mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::kv_client::KvClient;
use pb::maintenance_client::MaintenanceClient;

/// Finds the `etcd` binary, installing Debian's `etcd-server` if it is missing and `install`.
pub fn ensure_etcd(install: bool) -> Result<PathBuf, String> {
    let found = || {
        Command::new("etcd")
            .arg("--version")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
    };
    if let Some(v) = found() {
        eprintln!("using {v}");
        return Ok(PathBuf::from("etcd"));
    }
    if install {
        eprintln!(
            "etcd not found; installing Debian's etcd-server (apt-get install -y etcd-server)"
        );
        let ok = Command::new("apt-get")
            .args(["install", "-y", "etcd-server"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            if let Some(v) = found() {
                eprintln!("using {v}");
                return Ok(PathBuf::from("etcd"));
            }
        }
    }
    Err("etcd is not installed: apt-get install etcd-server (or pass --skip-etcd)".into())
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    /// The member's certificate, for its client and peer ports alike (`start_tls`).
    cert: Option<LeafFiles>,
    child: Option<Child>,
}

/// The certificates of a cluster serving TLS.
struct EtcdTls {
    pki: TestPki,
    /// What the benchmark's clients (and the leader polls) connect with: the CA, and a client
    /// certificate, which `--client-cert-auth` requires.
    client: ClientTls,
}

pub struct EtcdCluster {
    _dir: tempfile::TempDir,
    binary: PathBuf,
    members: Vec<Member>,
    initial_cluster: String,
    tls: Option<EtcdTls>,
}

impl EtcdCluster {
    pub fn start(binary: PathBuf, n: usize) -> Result<Self, String> {
        Self::start_with(binary, n, false)
    }

    /// A cluster serving mutual TLS on both its client and peer ports, with certificates from a
    /// test CA of its own made with the same tooling as the coord TLS ensemble's
    /// ([`TestPki`]).
    pub fn start_tls(binary: PathBuf, n: usize) -> Result<Self, String> {
        Self::start_with(binary, n, true)
    }

    fn start_with(binary: PathBuf, n: usize, tls: bool) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("coord-bench-etcd-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let tls = tls.then(|| {
            let pki = TestPki::new(&dir.path().join("certs"), "etcd", &[]);
            let client = pki.client(Some(&pki.client_identity("bench")));
            EtcdTls { pki, client }
        });
        let ports = free_ports(2 * n);
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("e{}", i + 1),
                client_port: ports[2 * i],
                peer_port: ports[2 * i + 1],
                data_dir: dir.path().join(format!("e{}", i + 1)),
                log: dir.path().join(format!("e{}.log", i + 1)),
                cert: tls.as_ref().map(|t| member_cert(&t.pki, i)),
                child: None,
            })
            .collect();
        let scheme = scheme(tls.is_some());
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={scheme}://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut c = Self {
            _dir: dir,
            binary,
            members,
            initial_cluster,
            tls,
        };
        for i in 0..n {
            c.spawn(i)?;
        }
        Ok(c)
    }

    /// The etcd flags of member `i`'s TLS: mutual TLS on the client port and on the peer port,
    /// both trusting only the cluster's CA; none for a plain cluster.
    fn tls_args(&self, i: usize) -> Vec<String> {
        let (Some(tls), Some(cert)) = (&self.tls, &self.members[i].cert) else {
            return Vec::new();
        };
        let ca = tls.pki.ca_path().display().to_string();
        let crt = cert.cert.display().to_string();
        let key = cert.key.display().to_string();
        vec![
            "--client-cert-auth".into(),
            "--trusted-ca-file".into(),
            ca.clone(),
            "--cert-file".into(),
            crt.clone(),
            "--key-file".into(),
            key.clone(),
            "--peer-client-cert-auth".into(),
            "--peer-trusted-ca-file".into(),
            ca,
            "--peer-cert-file".into(),
            crt,
            "--peer-key-file".into(),
            key,
        ]
    }

    /// The gRPC endpoint of a member's client address (one of [`Self::endpoints`]), over TLS
    /// with the benchmark's client certificate when the cluster serves TLS.
    fn endpoint(&self, addr: &str) -> Result<Endpoint, String> {
        coord_proto::tls::endpoint(addr, self.tls.as_ref().map(|t| &t.client))
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log)
            .map_err(|e| e.to_string())?;
        let scheme = scheme(self.tls.is_some());
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("{scheme}://127.0.0.1:{}", m.peer_port);
        let child = Command::new(&self.binary)
            .args(["--name", &m.name, "--data-dir"])
            .arg(&m.data_dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &self.initial_cluster])
            .args([
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "coord-bench",
            ])
            .args(self.tls_args(i))
            .args(["--log-level", "warn", "--logger", "zap"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start etcd: {e}"))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect()
    }

    /// The index of the member every running member names as leader.
    async fn agreed_leader(&self) -> Option<usize> {
        let mut leader_id = None;
        let mut ids = Vec::new();
        for m in &self.members {
            if m.child.is_none() {
                ids.push(None);
                continue;
            }
            let ch = self
                .endpoint(&format!("127.0.0.1:{}", m.client_port))
                .ok()?
                .connect_timeout(Duration::from_millis(500))
                .connect()
                .await
                .ok()?;
            let mut req = tonic::Request::new(pb::StatusRequest {});
            req.set_timeout(Duration::from_secs(2));
            let s = MaintenanceClient::new(ch)
                .status(req)
                .await
                .ok()?
                .into_inner();
            if s.leader == 0 || leader_id.is_some_and(|l| l != s.leader) {
                return None;
            }
            leader_id = Some(s.leader);
            ids.push(s.header.map(|h| h.member_id));
        }
        let leader_id = leader_id?;
        ids.iter().position(|id| *id == Some(leader_id))
    }

    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.agreed_leader().await {
                return Ok(l);
            }
            if Instant::now() > deadline {
                return Err(format!("etcd elected no leader within {timeout:?}"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A member's certificate: coord's test CA issues it as a replica's, which is what an etcd member
/// needs on both its ports: server and client authentication (it serves clients and peers, and
/// calls peers), valid for 127.0.0.1, the address everything reaches it by.
fn member_cert(pki: &TestPki, i: usize) -> LeafFiles {
    pki.issue(&pki.replica(i as u64 + 1))
}

fn scheme(tls: bool) -> &'static str {
    if tls {
        "https"
    } else {
        "http"
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// Kills etcd's leader and brings it back, for the failover benchmark.
pub struct EtcdEnsemble<'a> {
    pub cluster: &'a mut EtcdCluster,
    killed: Option<usize>,
}

impl<'a> EtcdEnsemble<'a> {
    pub fn new(cluster: &'a mut EtcdCluster) -> Self {
        Self {
            cluster,
            killed: None,
        }
    }
}

impl Ensemble for EtcdEnsemble<'_> {
    async fn kill_leader(&mut self) -> String {
        let leader = self
            .cluster
            .wait_for_leader(Duration::from_secs(30))
            .await
            .unwrap_or(0);
        self.cluster.kill(leader);
        self.killed = Some(leader);
        self.cluster.members[leader].name.clone()
    }

    async fn recover(&mut self) {
        let Some(i) = self.killed.take() else { return };
        if let Err(e) = self.cluster.spawn(i) {
            eprintln!("restarting etcd member {i}: {e}");
        }
        let _ = self.cluster.wait_for_leader(Duration::from_secs(60)).await;
    }
}

/// One etcd client connection set: a channel to every member, calls going to the one that last
/// answered, moving on to the next member on any error (etcd followers forward proposals, so any
/// member can serve). An attempt that takes longer than [`ATTEMPT_TIMEOUT`] is abandoned and
/// retried elsewhere, as etcd's own client does with a request deadline: without it a request
/// stuck on a follower whose leader died waits for etcd's 7 s server-side timeout.
struct EtcdConn {
    channels: Vec<Channel>,
    preferred: AtomicUsize,
}

pub struct EtcdTarget {
    conns: Vec<EtcdConn>,
}

impl EtcdTarget {
    /// `connections` connection sets, each preferring the current leader.
    pub async fn connect(cluster: &EtcdCluster, connections: usize) -> Result<Self, String> {
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await?;
        let mut conns = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let channels = cluster
                .endpoints()
                .iter()
                .map(|addr| {
                    cluster.endpoint(addr).map(|e| {
                        e.connect_timeout(Duration::from_millis(500))
                            .tcp_nodelay(true)
                            .connect_lazy()
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            conns.push(EtcdConn {
                channels,
                preferred: AtomicUsize::new(leader),
            });
        }
        Ok(Self { conns })
    }

    async fn call<F, Fut>(&self, conn: usize, f: F) -> Result<(), String>
    where
        F: Fn(KvClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<(), tonic::Status>>,
    {
        let c = &self.conns[conn];
        let n = c.channels.len();
        let started = Instant::now();
        let mut at = c.preferred.load(Ordering::Relaxed);
        loop {
            let attempt =
                tokio::time::timeout(ATTEMPT_TIMEOUT, f(KvClient::new(c.channels[at].clone())))
                    .await
                    .unwrap_or_else(|_| Err(tonic::Status::deadline_exceeded("attempt timed out")));
            match attempt {
                Ok(()) => {
                    c.preferred.store(at, Ordering::Relaxed);
                    return Ok(());
                }
                Err(e) if started.elapsed() > Duration::from_secs(30) => return Err(e.to_string()),
                Err(_) => {
                    at = (at + 1) % n;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

impl KvTarget for EtcdTarget {
    async fn put(&self, conn: usize, key: String, value: Bytes) -> Result<(), String> {
        self.call(conn, |mut kv| {
            let req = pb::PutRequest {
                key: Bytes::from(key.clone()),
                value: value.clone(),
                ..Default::default()
            };
            async move { kv.put(req).await.map(|_| ()) }
        })
        .await
    }

    async fn get(&self, conn: usize, key: String) -> Result<(), String> {
        self.call(conn, |mut kv| {
            let req = pb::RangeRequest {
                key: Bytes::from(key.clone()),
                ..Default::default()
            };
            async move { kv.range(req).await.map(|_| ()) }
        })
        .await
    }

    fn connections(&self) -> usize {
        self.conns.len()
    }
}

//! TLS for every gRPC connection to a replica, and the identities its certificates carry.
//!
//! One CA per ensemble signs every certificate: the replicas' (server and peer-client at once),
//! the tasks', and the operators'. Who a certificate speaks for is a URI subject alternative name
//! ([`Identity`]), so the replica that receives a call knows whether it comes from another
//! replica (only replicas may send Raft traffic), from a task (which may act only as itself), or
//! from an operator's tool.
//!
//! Files are read and parsed when the configuration is built, not on the first connection, so a
//! missing file, a file with no certificate or a key that is not a key is reported at start-up,
//! naming the file.
//!
//! The `endpoints` submodule reads the replicas' addresses as users write them (`host:port`,
//! `http://` or `https://` URLs) and checks a URL's scheme against the TLS configuration.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity as TlsIdentity};

mod endpoints;
pub use endpoints::{endpoint_addrs, parse_endpoint, EndpointError, EndpointSpec, Transport};

/// The URI scheme of coord identities.
pub const SCHEME: &str = "coord";

/// Who a certificate speaks for, within one ensemble (`cluster`, the replicas' `--cluster-token`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// `coord://<cluster>/replica/<id>`: a replica; the only identity that may send Raft traffic.
    Replica { cluster: String, id: u64 },
    /// `coord://<cluster>/task/<job>/<index>`: a training task; it may register, heartbeat,
    /// report errors and wait at barriers only as itself. `coord://<cluster>/ns/<namespace>/task/
    /// <job>/<index>`: the same, bound to that namespace, and refused in every other.
    Task {
        cluster: String,
        job: String,
        index: u32,
        /// The namespace it belongs to (`None`: the default one).
        namespace: Option<String>,
    },
    /// `coord://<cluster>/client/<name>`: an operator or tool (coordctl, a proxy serving several
    /// tasks); anything but Raft traffic.
    Client { cluster: String, name: String },
}

impl Identity {
    pub fn cluster(&self) -> &str {
        match self {
            Identity::Replica { cluster, .. }
            | Identity::Task { cluster, .. }
            | Identity::Client { cluster, .. } => cluster,
        }
    }

    /// The identity a URI names, or why it names none. URIs of other schemes are `Ok(None)`: a
    /// certificate may carry other names beside its coord identity.
    pub fn parse(uri: &str) -> Result<Option<Self>, String> {
        let Some(rest) = uri.strip_prefix("coord://") else {
            return Ok(None);
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let bad = |why: &str| Err(format!("{uri:?} is not a coord identity: {why}"));
        match parts.as_slice() {
            ["", ..] => bad("the ensemble name is empty"),
            [cluster, "replica", id] => match id.parse::<u64>() {
                Ok(id) => Ok(Some(Identity::Replica {
                    cluster: cluster.to_string(),
                    id,
                })),
                Err(_) => bad("the replica id is not a number"),
            },
            [_, "ns", "", ..] => bad("the namespace name is empty"),
            [_, "task", "", _] | [_, "ns", _, "task", "", _] => bad("the job name is empty"),
            [cluster, "task", job, index] => match index.parse::<u32>() {
                Ok(index) => Ok(Some(Identity::Task {
                    cluster: cluster.to_string(),
                    job: job.to_string(),
                    index,
                    namespace: None,
                })),
                Err(_) => bad("the task index is not a number"),
            },
            [cluster, "ns", namespace, "task", job, index] => match index.parse::<u32>() {
                Ok(index) => Ok(Some(Identity::Task {
                    cluster: cluster.to_string(),
                    job: job.to_string(),
                    index,
                    namespace: Some(namespace.to_string()),
                })),
                Err(_) => bad("the task index is not a number"),
            },
            [_, "client", ""] => bad("the client name is empty"),
            [cluster, "client", name] => Ok(Some(Identity::Client {
                cluster: cluster.to_string(),
                name: name.to_string(),
            })),
            _ => bad(
                "expected coord://<ensemble>/replica/<id>, /task/<job>/<index>, /ns/<namespace>/task/<job>/<index> or /client/<name>",
            ),
        }
    }
}

/// What every replica identity of ensemble `cluster` starts with, `coord://<cluster>/replica/`:
/// the prefix a client that checks its server by URI SAN is given (jaxlib's
/// `mtls_peer_uri_prefix`, which must end with `/`).
pub fn replica_uri_prefix(cluster: &str) -> String {
    format!("{SCHEME}://{cluster}/replica/")
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Replica { cluster, id } => write!(f, "{SCHEME}://{cluster}/replica/{id}"),
            Identity::Task {
                cluster,
                job,
                index,
                namespace: None,
            } => write!(f, "{SCHEME}://{cluster}/task/{job}/{index}"),
            Identity::Task {
                cluster,
                job,
                index,
                namespace: Some(ns),
            } => write!(f, "{SCHEME}://{cluster}/ns/{ns}/task/{job}/{index}"),
            Identity::Client { cluster, name } => write!(f, "{SCHEME}://{cluster}/client/{name}"),
        }
    }
}

/// A TLS file that cannot be used, naming it and saying why.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} {path} holds no PEM certificate")]
    NoCertificate { what: &'static str, path: PathBuf },
    #[error("{what} {path} is not a PEM certificate file: {why}")]
    BadCertificate {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    #[error("key {path} holds no PEM private key: {why}")]
    BadKey { path: PathBuf, why: String },
    #[error("{0}")]
    Config(String),
}

/// A PEM file of certificates (at least one): its text, and the certificates as DER.
fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::BadCertificate {
            what,
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok((pem, certs))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// The certificate and key a party presents, read and checked.
#[derive(Clone)]
pub struct KeyPair {
    /// The certificate chain, leaf first, as DER.
    pub chain: Vec<CertificateDer<'static>>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl KeyPair {
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let (cert_pem, chain) = read_certificates("certificate", cert)?;
        let key_pem = read("key", key)?;
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::BadKey {
            path: key.to_path_buf(),
            why: e.to_string(),
        })?;
        Ok(Self {
            chain,
            cert_pem,
            key_pem,
        })
    }

    fn tonic(&self) -> TlsIdentity {
        TlsIdentity::from_pem(&self.cert_pem, &self.key_pem)
    }

    /// The private key, as DER (checked when the pair was loaded).
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        PrivateKeyDer::from_pem_slice(&self.key_pem).map_err(|e| TlsError::BadKey {
            path: PathBuf::new(),
            why: e.to_string(),
        })
    }
}

/// The trusted CA: certificates of the ensemble are signed by it.
#[derive(Clone)]
pub struct Ca {
    pem: Vec<u8>,
    /// The certificates of the file, as DER.
    pub certificates: Vec<CertificateDer<'static>>,
}

impl Ca {
    pub fn load(path: &Path) -> Result<Self, TlsError> {
        let (pem, certificates) = read_certificates("CA certificate", path)?;
        Ok(Self { pem, certificates })
    }

    fn tonic(&self) -> Certificate {
        Certificate::from_pem(&self.pem)
    }
}

/// How a client (a replica calling a peer, an agent, coordctl, coord-proxy) connects over TLS.
/// Clones share one configuration, which [`ClientTls::replace`] changes for all of them (a
/// replica's rotated certificate); connections made before keep the one they began with.
#[derive(Clone)]
pub struct ClientTls {
    shared: std::sync::Arc<std::sync::RwLock<(ClientTlsConfig, u64)>>,
}

impl ClientTls {
    /// Trusts servers signed by `ca`; presents `identity` when given. `server_name` overrides the
    /// name a server's certificate is checked against (by default the host of its address).
    pub fn new(ca: &Ca, identity: Option<&KeyPair>, server_name: Option<&str>) -> Self {
        let mut config = ClientTlsConfig::new().ca_certificate(ca.tonic());
        if let Some(pair) = identity {
            config = config.identity(pair.tonic());
        }
        if let Some(name) = server_name {
            config = config.domain_name(name);
        }
        Self {
            shared: std::sync::Arc::new(std::sync::RwLock::new((config, 0))),
        }
    }

    fn current(&self) -> (ClientTlsConfig, u64) {
        self.shared
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts `next`'s configuration in force for this and every clone, and counts a generation.
    pub fn replace(&self, next: &ClientTls) {
        let (config, _) = next.current();
        let mut g = self
            .shared
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *g = (config, g.1 + 1);
    }

    /// How many times the configuration was replaced: a cache of connections made with it is
    /// stale when this moved.
    pub fn generation(&self) -> u64 {
        // Read on every peer call: the configuration itself is not copied for it.
        self.shared
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .1
    }

    /// Reads the files and builds the configuration; `cert` and `key` go together.
    pub fn load(
        ca: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
        server_name: Option<&str>,
    ) -> Result<Self, TlsError> {
        let ca = Ca::load(ca)?;
        let pair = match (cert, key) {
            (Some(c), Some(k)) => Some(KeyPair::load(c, k)?),
            (None, None) => None,
            (Some(_), None) => {
                return Err(TlsError::Config(
                    "a client certificate needs its key (--tls-key)".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(TlsError::Config(
                    "a client key needs its certificate (--tls-cert)".into(),
                ))
            }
        };
        Ok(Self::new(&ca, pair.as_ref(), server_name))
    }
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientTls")
    }
}

/// The endpoint of the gRPC server at `addr` (`host:port`): `https` with `tls`, `http` without.
/// What a user wrote (a URL, perhaps) becomes `host:port` through [`endpoint_addrs`] first.
pub fn endpoint(addr: &str, tls: Option<&ClientTls>) -> Result<Endpoint, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| format!("bad address {addr:?}: {e}"))?;
    match tls {
        Some(t) => endpoint
            .tls_config(t.current().0)
            .map_err(|e| format!("TLS for {addr}: {e}")),
        None => Ok(endpoint),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_round_trip() {
        for id in [
            Identity::Replica {
                cluster: "coord".into(),
                id: 3,
            },
            Identity::Task {
                cluster: "prod".into(),
                job: "worker".into(),
                index: 12,
                namespace: None,
            },
            Identity::Task {
                cluster: "prod".into(),
                job: "worker".into(),
                index: 0,
                namespace: Some("job-7".into()),
            },
            Identity::Client {
                cluster: "coord".into(),
                name: "ops".into(),
            },
        ] {
            assert_eq!(Identity::parse(&id.to_string()), Ok(Some(id)));
        }
        let replica = Identity::Replica {
            cluster: "coord".into(),
            id: 2,
        };
        assert!(replica
            .to_string()
            .starts_with(&replica_uri_prefix("coord")));
        assert!(!replica.to_string().starts_with(&replica_uri_prefix("coo")));
    }

    #[test]
    fn malformed_identities_say_why() {
        assert_eq!(Identity::parse("spiffe://x/y"), Ok(None));
        for (uri, why) in [
            ("coord:///replica/1", "ensemble name is empty"),
            ("coord://c/replica/x", "replica id is not a number"),
            ("coord://c/task/worker/-1", "task index is not a number"),
            ("coord://c/task//1", "job name is empty"),
            ("coord://c/ns//task/w/1", "namespace name is empty"),
            ("coord://c/ns/a/task//1", "job name is empty"),
            ("coord://c/ns/a/task/w/x", "task index is not a number"),
            ("coord://c/ns/a/b/task/w/1", "expected coord://"),
            ("coord://c/client/", "client name is empty"),
            ("coord://c/admin", "expected coord://"),
            ("coord://c/replica/1/2", "expected coord://"),
        ] {
            let err = Identity::parse(uri).expect_err(uri);
            assert!(err.contains(why), "{uri}: {err}");
        }
    }

    /// Random URIs never panic the parser, and what it accepts prints back to itself.
    #[test]
    fn fuzz_identity_uris() {
        let mut next = crate::fuzz::xorshift(0x1D_E7);
        let pieces = [
            "coord://", "c", "replica", "task", "client", "ns", "/", "7", "-1", "", "é", "x/y",
        ];
        for _ in 0..20_000 {
            let n = 1 + next() % 8;
            let uri: String = (0..n)
                .map(|_| pieces[(next() % pieces.len() as u64) as usize])
                .collect();
            if let Ok(Some(id)) = Identity::parse(&uri) {
                assert_eq!(id.to_string(), uri);
            }
        }
    }

    #[test]
    fn unusable_files_are_named() {
        let dir = std::env::temp_dir().join(format!("coord-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let missing = dir.join("missing.pem");
        let err = Ca::load(&missing).err().expect("missing file");
        assert!(err.to_string().contains("missing.pem"), "{err}");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let err = Ca::load(&empty).err().expect("no certificate");
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}

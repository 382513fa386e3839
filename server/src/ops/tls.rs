//! TLS of one replica, from the `--tls-*` flags: the server side of its gRPC port and the client
//! side it uses toward its peers (the same certificate for both), checked at start-up
//! ([`crate::ops::replica_cert`]) so that a wrong file or a certificate made for another replica
//! stops the replica with a clear message instead of failing every handshake later.
//!
//! The port's handshakes are done here, not by tonic ([`upgrade`]): each refused handshake is
//! logged as a warning naming the caller's address and the reason (a certificate of another CA,
//! none where one is required, a plain-gRPC client), and a caller that never finishes its
//! handshake is dropped after [`HANDSHAKE_TIMEOUT`]. tonic still sees the TLS stream, so
//! handlers read the caller's certificate from the request (see [`crate::ops::authz`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_proto::tls::{Ca, ClientTls, KeyPair};
use futures::future::BoxFuture;
use tokio::net::TcpStream;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::ops::config::{Args, ClientAuthArg};
use crate::ops::replica_cert;

/// How long a caller may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Refused handshakes logged per second at most (a port scan must not flood the log); the rest
/// are counted in the next line.
const LOGGED_PER_SECOND: u64 = 10;

/// A replica's TLS configuration.
pub struct ReplicaTls {
    /// The gRPC port's.
    pub server: Arc<ServerConfig>,
    /// The certificate the port serves, reloadable (see [`crate::ops::tls_reload`]).
    pub served: Arc<crate::ops::tls_reload::ServedCert>,
    /// For calls to peers (Raft, forwarded requests, status probes).
    pub client: ClientTls,
    /// The Raft links' and pre-appends' TLS, both ways (`raft::link_tls`).
    pub link: Arc<crate::raft::link_tls::LinkTls>,
}

/// The configuration the flags ask for: `None` without `--tls-cert` (plain gRPC).
pub fn from_args(args: &Args) -> Result<Option<ReplicaTls>, String> {
    let (Some(cert), Some(key), Some(ca)) = (&args.tls_cert, &args.tls_key, &args.tls_ca) else {
        return Ok(None);
    };
    let pair = KeyPair::load(cert, key).map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
    let ca = Ca::load(ca).map_err(|e| format!("--tls-ca: {e}"))?;
    replica_cert::check_pair(args, &pair, &ca)?;
    let client = ClientTls::new(&ca, Some(&pair), None);
    let served = Arc::new(crate::ops::tls_reload::ServedCert::new(
        args,
        &pair,
        client.clone(),
    )?);
    let server = server_config(served.clone(), &ca, args.tls_client_auth)?;
    let link = crate::raft::link_tls::LinkTls::new(served.clone(), &ca, &args.cluster_token)?;
    Ok(Some(ReplicaTls {
        server: Arc::new(server),
        served,
        client,
        link: Arc::new(link),
    }))
}

fn server_config(
    served: Arc<crate::ops::tls_reload::ServedCert>,
    ca: &Ca,
    auth: ClientAuthArg,
) -> Result<ServerConfig, String> {
    let verifier = WebPkiClientVerifier::builder(replica_cert::roots(ca)?);
    let verifier = match auth {
        ClientAuthArg::Optional => verifier.allow_unauthenticated(),
        ClientAuthArg::Require => verifier,
    }
    .build()
    .map_err(|e| format!("--tls-ca: {e}"))?;
    let mut config = ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(served);
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The TLS side of the gRPC port, for [`crate::raft::accept::incoming`]: a connection's handshake,
/// bounded by [`HANDSHAKE_TIMEOUT`]; a refused one is logged (see [`RefusalLog`]) and dropped.
pub fn upgrade(
    config: Arc<ServerConfig>,
) -> impl Fn(TcpStream, SocketAddr) -> BoxFuture<'static, Option<TlsStream<TcpStream>>>
       + Send
       + Sync
       + 'static {
    let acceptor = TlsAcceptor::from(config);
    let log = Arc::new(RefusalLog::default());
    move |tcp, peer| {
        let (acceptor, log) = (acceptor.clone(), log.clone());
        Box::pin(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => Some(tls),
                Ok(Err(e)) => {
                    log.refused(peer, &e.to_string());
                    None
                }
                Err(_) => {
                    log.refused(peer, "no handshake within the timeout");
                    None
                }
            }
        })
    }
}

/// Logs refused handshakes, at most [`LOGGED_PER_SECOND`] a second.
struct RefusalLog {
    start: Instant,
    /// The second (since `start`) of the lines being counted, and how many were logged in it.
    second: AtomicU64,
    logged: AtomicU64,
    suppressed: AtomicU64,
}

impl Default for RefusalLog {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            second: AtomicU64::new(0),
            logged: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl RefusalLog {
    fn refused(&self, peer: SocketAddr, why: &str) {
        let now = self.start.elapsed().as_secs();
        if self.second.swap(now, Ordering::Relaxed) != now {
            self.logged.store(0, Ordering::Relaxed);
        }
        if self.logged.fetch_add(1, Ordering::Relaxed) >= LOGGED_PER_SECOND {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
        tracing::warn!(%peer, error = %why, suppressed, "TLS handshake refused");
    }
}

//! TLS for the framed links (`link`, `pre_append`) of a TLS ensemble.
//!
//! A link is opened as over plain TCP, preface first (that is how the port tells it apart from a
//! gRPC client), and then both ends do a TLS 1.3 handshake in which each presents its replica
//! certificate, the one its gRPC port serves (reloaded with it, see `ops::tls_reload`). Each end
//! checks the other's chain against `--tls-ca` and then its coord identity: only a replica of this
//! ensemble may open or answer a link, as only a replica may send Raft traffic over gRPC. The
//! client also checks the host name it dialled, as a gRPC peer channel does.
//!
//! After the handshake a link costs what TLS records cost: one encryption per frame, no HTTP/2
//! and no tonic, so a TLS ensemble replicates as a plain one does.
//!
//! A leader's pre-appends are written from its Raft thread without waiting (see `pre_append`):
//! their handshake is done here, asynchronously, and the session is then handed over as a plain
//! socket and a [`ClientConnection`] that encrypts each frame in place ([`SyncTls`]). The link
//! server sends no session tickets, so nothing is ever written toward a pre-append's sender.

use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use coord_proto::tls::{Ca, Identity};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls::client::ResolvesClientCert;
use tokio_rustls::rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{
    ClientConfig, ClientConnection, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::ops::tls_reload::ServedCert;

/// How long a link's handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The ALPN protocol of a link: a link server never mistakes a gRPC client for a peer's link.
const ALPN: &[u8] = b"coord-link/1";

/// The TLS of a replica's links, both ways.
pub struct LinkTls {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
    /// This ensemble's name (`--cluster-token`): a link's other end must be one of its replicas.
    cluster: String,
}

/// A replica's own certificate as its links' client certificate: the one its port serves.
#[derive(Debug)]
struct OwnCert(Arc<ServedCert>);

impl ResolvesClientCert for OwnCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        self.0.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl LinkTls {
    pub fn new(served: Arc<ServedCert>, ca: &Ca, cluster: &str) -> Result<Self, String> {
        let mut roots = RootCertStore::empty();
        for c in &ca.certificates {
            roots
                .add(c.clone())
                .map_err(|e| format!("--tls-ca: a certificate cannot be a trust root: {e}"))?;
        }
        let roots = Arc::new(roots);
        let mut client = ClientConfig::builder()
            .with_root_certificates(roots.clone())
            .with_client_cert_resolver(Arc::new(OwnCert(served.clone())));
        client.alpn_protocols = vec![ALPN.to_vec()];
        // A session is never resumed: the server sends no tickets (see the module's docs).
        client.resumption = tokio_rustls::rustls::client::Resumption::disabled();
        let verifier = WebPkiClientVerifier::builder(roots)
            .build()
            .map_err(|e| format!("--tls-ca: {e}"))?;
        let mut server = ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(served as Arc<dyn ResolvesServerCert>);
        server.alpn_protocols = vec![ALPN.to_vec()];
        server.send_tls13_tickets = 0;
        Ok(Self {
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
            cluster: cluster.to_string(),
        })
    }

    /// Checks that `chain` (the other end's, already verified against the CA) is a replica's of
    /// this ensemble.
    fn check_peer(&self, chain: Option<&[rustls_pki_types::CertificateDer<'_>]>) -> io::Result<()> {
        let leaf = chain
            .and_then(|c| c.first())
            .ok_or_else(|| io::Error::other("the other end presented no certificate"))?;
        match crate::ops::authz::identity_of(leaf).map_err(io::Error::other)? {
            Identity::Replica { cluster, .. } if cluster == self.cluster => Ok(()),
            other => Err(io::Error::other(format!(
                "a link's other end must be a replica of ensemble {:?}; it is {other}",
                self.cluster
            ))),
        }
    }

    /// The client side of a link to `addr` over `tcp` (its preface already sent).
    pub async fn connect(
        &self,
        addr: &str,
        tcp: TcpStream,
    ) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::other(format!("{host:?} is not a host name: {e}")))?;
        let tls = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.connector.connect(name, tcp))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "link handshake timed out"))??;
        self.check_peer(tls.get_ref().1.peer_certificates())?;
        Ok(tls)
    }

    /// The server side of a link from `peer` (its preface already read); `None`, logged, when
    /// the handshake fails or the other end is not a replica of this ensemble.
    pub async fn accept(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
    ) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
        let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::warn!(%peer, error = %e, "link TLS handshake refused");
                return None;
            }
            Err(_) => {
                tracing::warn!(%peer, "link TLS handshake timed out");
                return None;
            }
        };
        match self.check_peer(tls.get_ref().1.peer_certificates()) {
            Ok(()) => Some(tls),
            Err(e) => {
                tracing::warn!(%peer, error = %e, "link refused");
                None
            }
        }
    }
}

/// A link's stream on the sending side: plain TCP, or TLS over it.
pub enum LinkStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for LinkStream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            LinkStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A pre-append connection's TLS session, written from synchronous code: each frame is
/// encrypted in place and written to the non-blocking socket in one call.
pub struct SyncTls {
    session: ClientConnection,
    /// Records to send, reused from frame to frame.
    out: Vec<u8>,
}

impl SyncTls {
    /// Takes over a link's session after its handshake: the socket, non-blocking, and the
    /// session.
    pub fn take(
        tls: tokio_rustls::client::TlsStream<TcpStream>,
    ) -> io::Result<(std::net::TcpStream, Self)> {
        let (tcp, session) = tls.into_inner();
        Ok((
            tcp.into_std()?,
            Self {
                session,
                out: Vec::new(),
            },
        ))
    }

    /// `frame` as TLS records, ready to be written in one piece; the session now counts them
    /// as sent, so a connection that cannot take them all must be dropped.
    pub fn seal(&mut self, frame: &[u8]) -> io::Result<&[u8]> {
        self.out.clear();
        self.session.writer().write_all(frame)?;
        while self.session.wants_write() {
            self.session.write_tls(&mut self.out)?;
        }
        Ok(&self.out)
    }
}

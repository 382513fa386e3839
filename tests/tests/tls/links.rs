//! Raft links and pre-appends over TLS: only replicas of the ensemble may open them.

use std::time::Duration;

use coord_proto::tls::Identity;
use coord_tests::certs::TestPki;

use super::{client_of, tls_cluster, TIMEOUT};

/// A link (`link_tls`) is TLS with a replica certificate of this ensemble, both ways: a link
/// from any other certificate, from none, or in plain TCP is closed unanswered; a replica's
/// certificate keeps it open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_are_taken_only_from_replicas_of_the_ensemble() {
    use coord_proto::conn::{PRE_APPEND_PREFACE, RAFT_LINK_PREFACE};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let c = tls_cluster(&[]).await;
    let pki = c.pki();
    let addr = c.replica(1).grpc;
    let other_ensemble = Identity::Replica {
        cluster: "other".into(),
        id: 2,
    };
    // Whether the replica closes a link opened with `preface` and (TLS) `identity`'s certificate
    // before `patience` passes.
    let closed = |preface: &'static [u8], identity: Option<Identity>| async move {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(preface).await.expect("preface");
        // Closed: the stream ends (after an alert, perhaps) or fails.
        let mut buf = Vec::new();
        let patience = Duration::from_secs(3);
        let Some(identity) = identity else {
            // Plain frames, where the replica expects a TLS hello.
            tcp.write_all(&[4, 0, 0, 0, 1, 2, 3, 4])
                .await
                .expect("write");
            return tokio::time::timeout(patience, tcp.read_to_end(&mut buf))
                .await
                .is_ok();
        };
        let config = link_client_config(pki, &identity);
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let mut tls = match tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
        {
            Ok(tls) => tls,
            Err(_) => return true,
        };
        tokio::time::timeout(patience, tls.read_to_end(&mut buf))
            .await
            .is_ok()
    };
    for preface in [RAFT_LINK_PREFACE, PRE_APPEND_PREFACE] {
        let name = String::from_utf8_lossy(preface).trim().to_string();
        assert!(
            !closed(preface, Some(pki.replica(2))).await,
            "{name}: a replica's link was closed"
        );
        for (who, identity) in [
            ("a task", Some(pki.task("worker", 0))),
            ("an operator", Some(pki.client_identity("ops"))),
            (
                "a replica of another ensemble",
                Some(other_ensemble.clone()),
            ),
            ("plain TCP", None),
        ] {
            assert!(
                closed(preface, identity).await,
                "{name}: {who}'s link was kept"
            );
        }
    }
    let log = c.log(1);
    for words in [
        "a link's other end must be a replica of ensemble \"coord\"; it is coord://coord/task/worker/0",
        "it is coord://coord/client/ops",
        "it is coord://other/replica/2",
        "link TLS handshake refused",
    ] {
        assert!(log.contains(words), "{words:?} not logged:\n{log}");
    }
    // The ensemble never noticed.
    let ops = pki.client_identity("ops");
    let client = client_of(c.endpoints(), pki.client(Some(&ops)), TIMEOUT);
    client.insert("after", "v", false).await.expect("insert");
}

/// A rustls client configuration for a link (its ALPN) trusting the test CA and presenting
/// `identity`'s certificate, issued on the spot.
fn link_client_config(
    pki: &TestPki,
    identity: &Identity,
) -> std::sync::Arc<tokio_rustls::rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let files = pki.issue(identity);
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.ca_path()).expect("read the CA") {
        roots.add(c.expect("a CA certificate")).expect("a root");
    }
    let chain = CertificateDer::pem_file_iter(&files.cert)
        .expect("read the certificate")
        .collect::<Result<Vec<_>, _>>()
        .expect("certificates");
    let key = PrivateKeyDer::from_pem_file(&files.key).expect("read the key");
    let mut config = tokio_rustls::rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("client certificate");
    config.alpn_protocols = vec![b"coord-link/1".to_vec()];
    std::sync::Arc::new(config)
}

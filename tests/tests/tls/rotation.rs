//! A replica's certificate rotated under load and served after SIGHUP.

use std::time::Duration;

use super::{client_of, tls_cluster, TIMEOUT};

/// The certificate replica `addr` serves to a new connection (DER), over a handshake without a
/// client certificate.
async fn served_certificate(addr: std::net::SocketAddr, ca: &std::path::Path) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("read the CA") {
        roots
            .add(c.expect("a CA certificate"))
            .expect("a trust root");
    }
    let config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = ServerName::try_from("127.0.0.1").expect("a server name");
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    tls.get_ref().1.peer_certificates().expect("a certificate")[0].to_vec()
}

fn first_certificate(path: &std::path::Path) -> Vec<u8> {
    use rustls_pki_types::pem::PemObject;
    rustls_pki_types::CertificateDer::pem_file_iter(path)
        .expect("read the certificate")
        .next()
        .expect("one certificate")
        .expect("a certificate")
        .to_vec()
}

/// A replica's certificate rotated (a new key and certificate from the same CA written over its
/// files) is served after SIGHUP, without a restart and without a failed call; a certificate
/// that does not name the replica is refused and the old one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_after_sighup_under_load() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let mut c = tls_cluster(&[]).await;
    let ca = c.pki().ca_path();
    let tls = c.pki().client(None);
    let stop = Arc::new(AtomicBool::new(false));
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let ok = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let load: Vec<_> = (0..3)
        .map(|w| {
            let cl = client_of(c.endpoints(), tls.clone(), TIMEOUT);
            let (stop, failed, ok) = (stop.clone(), failed.clone(), ok.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    match cl.insert(&format!("rot/{w}/{i}"), "v", false).await {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(e) => {
                            failed.lock().expect("lock").push(e.to_string());
                            0
                        }
                    };
                    i += 1;
                }
            })
        })
        .collect();

    let addr = c.replica(1).grpc;
    let before = served_certificate(addr, &ca).await;
    let files = c.pki().issue(&c.pki().replica(1));
    let rotated = first_certificate(&files.cert);
    assert_ne!(before, rotated, "a new certificate was issued");
    let pid = c.pid(1).expect("replica 1 runs");
    coord_tests::cluster::send_signal(i64::from(pid), "HUP");
    let deadline = std::time::Instant::now() + TIMEOUT;
    while served_certificate(addr, &ca).await != rotated {
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The reload is logged once the blocking reload task has returned to the watcher, which on
    // a loaded machine may be after the new certificate is already served.
    while !c.log(1).contains("TLS certificate reloaded") {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload was never logged:\n{}",
            c.log(1)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Replica 1's connections to its peers made from now on present the new pair: make it lead
    // (a handoff over TLS) and restart replica 3, so that its Raft traffic to 3 goes over new
    // connections; 3 must catch up.
    if c.wait_for_leader(TIMEOUT).await != 1 {
        let reply = client_of(c.endpoints(), tls.clone(), TIMEOUT)
            .transfer_leader(Some(1))
            .await
            .expect("transfer leadership to replica 1");
        assert_eq!(reply.leader, 1);
    }
    c.kill(3);
    c.spawn(3);
    assert_eq!(c.wait_for_leader(TIMEOUT).await, 1);
    let at = c.status(1).map_or(0, |s| s.last_log_index);
    c.wait_applied(3, at, TIMEOUT).await;

    // Replica 2's files replaced by a task's certificate: refused, the old one stays.
    let addr2 = c.replica(2).grpc;
    let before2 = served_certificate(addr2, &ca).await;
    let task = c.pki().issue(&c.pki().task("worker", 0));
    let own = c.pki().issue(&c.pki().replica(2));
    std::fs::copy(&task.cert, &own.cert).expect("copy");
    std::fs::copy(&task.key, &own.key).expect("copy");
    coord_tests::cluster::send_signal(i64::from(c.pid(2).expect("replica 2 runs")), "HUP");
    c.wait_until(TIMEOUT, "the bad certificate refused", |c| {
        c.log(2).contains("TLS certificate not reloaded")
    })
    .await;
    assert!(c.log(2).contains("is the certificate of"), "{}", c.log(2));
    assert_eq!(served_certificate(addr2, &ca).await, before2);

    // New clients connect, and the load never failed.
    client_of(c.endpoints(), tls.clone(), TIMEOUT)
        .insert("after/rotation", "v", false)
        .await
        .expect("a new client after the rotation");
    let before_stop = ok.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.expect("load");
    }
    let failed = failed.lock().expect("lock");
    println!(
        "rotation under load: {before_stop} writes, {} failed",
        failed.len()
    );
    assert!(before_stop > 0);
    assert!(failed.is_empty(), "{failed:?}");
}

//! What a replica's own certificate must be, checked before it is served: at start
//! ([`crate::ops::tls`]) and at every reload ([`crate::ops::tls_reload`]). It must name this
//! replica, be signed by `--tls-ca`, and name the host the peers reach this replica by, so that a
//! wrong file stops the replica (or leaves the served certificate in place) with a message naming
//! the problem, instead of failing every handshake later.
//!
//! A leaf of the TLS modules: it uses neither, so both can use it.

use std::sync::Arc;

use coord_proto::tls::{Ca, Identity, KeyPair};
use rustls_pki_types::{ServerName, UnixTime};
use tokio_rustls::rustls::client::danger::ServerCertVerifier;
use tokio_rustls::rustls::client::WebPkiServerVerifier;
use tokio_rustls::rustls::RootCertStore;

use crate::ops::config::Args;

/// Checks a certificate and key for this replica: that it names this replica, that the CA signed
/// it and that it names the host the peers reach this replica by. Done at start and at every
/// reload.
pub fn check_pair(args: &Args, pair: &KeyPair, ca: &Ca) -> Result<(), String> {
    let cert = args
        .tls_cert
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let expected = Identity::Replica {
        cluster: args.cluster_token.clone(),
        id: args.id,
    };
    let leaf = pair
        .chain
        .first()
        .ok_or_else(|| format!("--tls-cert {cert} holds no certificate"))?;
    match crate::ops::authz::identity_of(leaf) {
        Ok(own) if own == expected => {}
        Ok(other) => {
            return Err(format!(
                "--tls-cert {cert} is the certificate of {other}, not of this replica; it must name {expected}"
            ))
        }
        Err(why) => {
            return Err(format!(
                "--tls-cert {cert}: {why}; a replica's certificate must name {expected}"
            ))
        }
    }
    check_own_certificate(args, pair, ca)
}

pub(crate) fn roots(ca: &Ca) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for c in &ca.certificates {
        roots
            .add(c.clone())
            .map_err(|e| format!("--tls-ca: a certificate cannot be a trust root: {e}"))?;
    }
    Ok(Arc::new(roots))
}

/// What the peers will check of this replica's certificate, checked first here: that the CA
/// signed it, and that it names the host peers reach this replica by (its `--initial-cluster`
/// address; a joining replica's address is only known to `member add`).
fn check_own_certificate(args: &Args, pair: &KeyPair, ca: &Ca) -> Result<(), String> {
    let cert = args
        .tls_cert
        .as_deref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let (leaf, intermediates) = pair
        .chain
        .split_first()
        .ok_or_else(|| format!("--tls-cert {cert} holds no certificate"))?;
    let verifier = WebPkiServerVerifier::builder(roots(ca)?)
        .build()
        .map_err(|e| format!("--tls-ca: {e}"))?;
    let Some(addr) = args.initial_cluster.0.get(&args.id) else {
        return Ok(());
    };
    let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| format!("--initial-cluster: {host:?} is not a host name: {e}"))?;
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| {
            format!(
                "--tls-cert {cert} will not be accepted by the peers, who reach this replica at \
                 {addr} and trust --tls-ca: {e}"
            )
        })
}

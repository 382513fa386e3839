//! Certificate reload without a restart: the gRPC port serves its certificate through
//! [`ServedCert`], which reads `--tls-cert` and `--tls-key` again on SIGHUP and whenever the
//! files change (checked every [`CHECK_EVERY`]). A new pair is checked as at start (it must name
//! this replica, be signed by `--tls-ca` and name the host peers reach it by); a pair that fails,
//! or files caught half-written, leave the current certificate in place with a warning naming the
//! problem. Handshakes after a reload get the new certificate; connections already open keep the
//! one they began with, so calls in flight are not disturbed.
//!
//! The same pair is the client certificate this replica presents to its peers: a reload puts it
//! in force for the peer connections made from then on (`ClientTls::replace`; the peer channel
//! caches start afresh), and for the Raft links opened from then on (`raft::link_tls`), while
//! calls in flight finish on the connections they began on. The CA
//! (`--tls-ca`) is not reloaded.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use coord_proto::tls::{Ca, ClientTls, KeyPair};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::ops::config::Args;
use crate::ops::replica_cert;

/// How often the certificate files are looked at for a change.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The certificate the gRPC port serves.
pub struct ServedCert {
    args: Args,
    /// The client side toward peers, replaced with each new pair.
    peer: ClientTls,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times when last loaded.
    stamp: Mutex<Option<(SystemTime, SystemTime)>>,
    /// Certificates loaded after the first.
    pub reloads: AtomicU64,
}

impl fmt::Debug for ServedCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServedCert")
    }
}

impl ResolvesServerCert for ServedCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

fn certified(pair: &KeyPair) -> Result<CertifiedKey, String> {
    let key = pair.private_key().map_err(|e| format!("--tls-key: {e}"))?;
    let signing = tokio_rustls::rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("--tls-key: {e}"))?;
    Ok(CertifiedKey::new(pair.chain.clone(), signing))
}

impl ServedCert {
    /// Serves `pair` (already checked) for the replica of `args`.
    pub fn new(args: &Args, pair: &KeyPair, peer: ClientTls) -> Result<Self, String> {
        Ok(Self {
            args: args.clone(),
            peer,
            current: RwLock::new(Arc::new(certified(pair)?)),
            stamp: Mutex::new(stamp_of(args)),
            reloads: AtomicU64::new(0),
        })
    }

    /// The certificate served now (also the one the replica's links present, see
    /// `raft::link_tls`).
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }

    /// Loads the files again if they changed since the last load (or always, with `force`);
    /// returns whether a new certificate is served. `Err`: the current one stays, and why.
    pub fn reload(&self, force: bool) -> Result<bool, String> {
        let stamp = stamp_of(&self.args);
        {
            let last = self.stamp.lock().unwrap_or_else(PoisonError::into_inner);
            if !force && *last == stamp {
                return Ok(false);
            }
        }
        let (Some(cert), Some(key), Some(ca)) =
            (&self.args.tls_cert, &self.args.tls_key, &self.args.tls_ca)
        else {
            return Ok(false);
        };
        let pair = KeyPair::load(cert, key).map_err(|e| format!("--tls-cert/--tls-key: {e}"))?;
        let ca = Ca::load(ca).map_err(|e| format!("--tls-ca: {e}"))?;
        replica_cert::check_pair(&self.args, &pair, &ca)?;
        let next = Arc::new(certified(&pair)?);
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = next;
        self.peer.replace(&ClientTls::new(&ca, Some(&pair), None));
        *self.stamp.lock().unwrap_or_else(PoisonError::into_inner) = stamp;
        self.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}

fn stamp_of(args: &Args) -> Option<(SystemTime, SystemTime)> {
    let modified = |p: &Option<PathBuf>| {
        p.as_ref()
            .and_then(|p| std::fs::metadata(p).ok())
            .and_then(|m| m.modified().ok())
    };
    Some((modified(&args.tls_cert)?, modified(&args.tls_key)?))
}

/// Reloads `served` on SIGHUP and when its files change, for the process's life.
pub async fn watch(served: Arc<ServedCert>) {
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        #[cfg(unix)]
        let forced = match hup.as_mut() {
            Some(h) => tokio::select! {
                _ = h.recv() => true,
                () = tokio::time::sleep(CHECK_EVERY) => false,
            },
            None => {
                tokio::time::sleep(CHECK_EVERY).await;
                false
            }
        };
        #[cfg(not(unix))]
        let forced = {
            tokio::time::sleep(CHECK_EVERY).await;
            false
        };
        let served = served.clone();
        match tokio::task::spawn_blocking(move || served.reload(forced)).await {
            Ok(Ok(true)) => {
                tracing::info!(forced, "TLS certificate reloaded; new handshakes get it")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "TLS certificate not reloaded; still serving the previous one")
            }
            Err(e) => tracing::warn!(error = %e, "TLS certificate reload failed"),
        }
    }
}

//! The TLS flags of the agent's programs (coordctl, coord-proxy, data-worker, link-worker): one
//! definition, so every program reads the same flags and environment variables.
//!
//! With `--tls-ca` a program connects to the replicas over TLS and trusts the replicas the CA
//! signed; with `--tls-cert`/`--tls-key` as well it presents a certificate, which an ensemble
//! started with `--tls-client-auth require` insists on. A task's certificate names
//! `coord://<ensemble>/task/<job>/<index>` and lets it act only as that task; an operator's names
//! `coord://<ensemble>/client/<name>`.

use std::path::PathBuf;

use coord_proto::tls::ClientTls;

use crate::client::ClientOptions;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct TlsArgs {
    /// The ensemble's CA certificate (PEM): connect to the replicas over TLS and trust the
    /// certificates it signed.
    #[arg(long, env = "COORD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// This program's certificate (PEM), for an ensemble that asks for one.
    #[arg(long, env = "COORD_TLS_CERT", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "COORD_TLS_KEY", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,

    /// Check the replicas' certificates against this name instead of the host of each address
    /// (for replicas reached by an address their certificates do not name).
    #[arg(long, env = "COORD_TLS_SERVER_NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
}

impl TlsArgs {
    /// The client configuration the flags ask for: `None` without `--tls-ca` (plain gRPC).
    pub fn load(&self) -> Result<Option<ClientTls>, String> {
        let Some(ca) = &self.tls_ca else {
            return Ok(None);
        };
        ClientTls::load(
            ca,
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.tls_server_name.as_deref(),
        )
        .map(Some)
        .map_err(|e| e.to_string())
    }

    /// Client options for `endpoints` with the flags' TLS.
    pub fn client_options(&self, endpoints: Vec<String>) -> Result<ClientOptions, String> {
        let mut options = ClientOptions::new(endpoints);
        options.tls = self.load()?;
        Ok(options)
    }
}

//! The TLS tests' certificates: a test CA and replica certificates in a test's directory, made
//! with `coord-tools`' [`Ca`] (what `coord-certs` uses). A test helper: it panics on failure.

use std::path::{Path, PathBuf};

use coord_proto::tls::Identity;
use coord_tools::certs::{stem, Ca, LeafFiles, CA_CERT};

/// The certificates of a test ensemble in one directory: the CA, one certificate per replica (for
/// 127.0.0.1 and `localhost`), and whatever a test issues later.
pub struct TestPki {
    dir: PathBuf,
    ca: Ca,
    cluster: String,
}

impl TestPki {
    /// A new CA for ensemble `cluster` in `dir`, and certificates for replicas `ids`.
    pub fn new(dir: &Path, cluster: &str, ids: &[u64]) -> Self {
        let ca = Ca::new(cluster).expect("test CA");
        ca.write(dir).expect("write the test CA");
        let pki = Self {
            dir: dir.to_path_buf(),
            ca,
            cluster: cluster.to_string(),
        };
        for &id in ids {
            pki.issue(&pki.replica(id));
        }
        pki
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join(CA_CERT)
    }

    pub fn replica(&self, id: u64) -> Identity {
        Identity::Replica {
            cluster: self.cluster.clone(),
            id,
        }
    }

    /// What the replicas' identities start with (`coord://<cluster>/replica/`).
    pub fn replica_uri_prefix(&self) -> String {
        coord_proto::tls::replica_uri_prefix(&self.cluster)
    }

    pub fn task(&self, job: &str, index: u32) -> Identity {
        Identity::Task {
            cluster: self.cluster.clone(),
            job: job.to_string(),
            index,
            namespace: None,
        }
    }

    /// A task of namespace `ns`.
    pub fn task_in(&self, ns: &str, job: &str, index: u32) -> Identity {
        Identity::Task {
            cluster: self.cluster.clone(),
            job: job.to_string(),
            index,
            namespace: Some(ns.to_string()),
        }
    }

    pub fn client_identity(&self, name: &str) -> Identity {
        Identity::Client {
            cluster: self.cluster.clone(),
            name: name.to_string(),
        }
    }

    /// Writes a certificate for `identity` (valid for 127.0.0.1 and `localhost`). One of
    /// another ensemble goes to files named after that ensemble.
    pub fn issue(&self, identity: &Identity) -> LeafFiles {
        self.issue_for(
            identity,
            &["127.0.0.1".to_string(), "localhost".to_string()],
        )
    }

    /// Writes a certificate for `identity`, valid for `hosts`.
    pub fn issue_for(&self, identity: &Identity, hosts: &[String]) -> LeafFiles {
        let mut name = stem(identity);
        if identity.cluster() != self.cluster {
            name = format!("{}-{name}", identity.cluster());
        }
        self.ca
            .issue(identity, hosts)
            .and_then(|leaf| leaf.write(&self.dir, &name))
            .expect("issue a test certificate")
    }

    /// The TLS flags of replica `id` (its certificate must have been issued).
    pub fn replica_args(&self, id: u64) -> Vec<String> {
        let stem = stem(&self.replica(id));
        let path = |ext: &str| self.dir.join(format!("{stem}.{ext}")).display().to_string();
        vec![
            "--tls-cert".into(),
            path("crt"),
            "--tls-key".into(),
            path("key"),
            "--tls-ca".into(),
            self.ca_path().display().to_string(),
        ]
    }

    /// A client configuration trusting this CA and presenting `identity`'s certificate (issued
    /// on the spot), or none.
    pub fn client(&self, identity: Option<&Identity>) -> coord_proto::tls::ClientTls {
        let files = identity.map(|id| self.issue(id));
        coord_proto::tls::ClientTls::load(
            &self.ca_path(),
            files.as_ref().map(|f| f.cert.as_path()),
            files.as_ref().map(|f| f.key.as_path()),
            None,
        )
        .expect("client TLS configuration")
    }
}

//! A test CA and the certificates of an ensemble (replicas, tasks, operators), made with `rcgen`:
//! what `coord-certs` writes, and what the TLS tests (`coord-tests`' `TestPki`) make their
//! certificates with.
//!
//! Every leaf carries its coord identity as a URI alternative name (see
//! `coord_proto::tls::Identity`); a replica's also names the hosts it is reached by and may serve
//! as well as call (server and client authentication), the others only call.

use std::path::{Path, PathBuf};

use coord_proto::tls::Identity;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The file names of a CA directory.
pub const CA_CERT: &str = "ca.crt";
pub const CA_KEY: &str = "ca.key";

/// A CA of one ensemble.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

/// A certificate and its key, PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

/// Where a leaf was written.
pub struct LeafFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn ca_params(cluster: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("coord test CA ({cluster})"));
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn err(what: &str) -> impl Fn(rcgen::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl Ca {
    /// A new CA for ensemble `cluster`.
    pub fn new(cluster: &str) -> Result<Self, String> {
        let key = KeyPair::generate().map_err(err("CA key"))?;
        let params = ca_params(cluster);
        let cert_pem = params
            .self_signed(&key)
            .map_err(err("CA certificate"))?
            .pem();
        Ok(Self {
            issuer: Issuer::new(params, key),
            cert_pem,
        })
    }

    /// The CA `coord-certs ca` wrote to `dir` for ensemble `cluster`.
    pub fn load(dir: &Path, cluster: &str) -> Result<Self, String> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| format!("cannot read {}: {e}", dir.join(name).display()))
        };
        let cert_pem = read(CA_CERT)?;
        let key = KeyPair::from_pem(&read(CA_KEY)?).map_err(err("CA key"))?;
        let expected = format!("coord test CA ({cluster})");
        if !cert_pem_names(&cert_pem, &expected)? {
            return Err(format!(
                "the CA in {} is not the test CA of ensemble {cluster:?} (its subject is not {expected:?})",
                dir.display()
            ));
        }
        Ok(Self {
            issuer: Issuer::new(ca_params(cluster), key),
            cert_pem,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// Writes `ca.crt` and `ca.key` to `dir`; returns the certificate's path.
    pub fn write(&self, dir: &Path) -> Result<PathBuf, String> {
        write(dir, CA_CERT, &self.cert_pem)?;
        write(dir, CA_KEY, &self.issuer.key().serialize_pem())?;
        Ok(dir.join(CA_CERT))
    }

    /// A certificate for `identity`; `hosts` (names or IP addresses) are what a replica is
    /// reached by. The identity may name another ensemble than the CA's (the tests check that
    /// replicas refuse such certificates).
    pub fn issue(&self, identity: &Identity, hosts: &[String]) -> Result<Leaf, String> {
        let mut params = CertificateParams::new(hosts.to_vec()).map_err(err("host names"))?;
        let uri = identity.to_string();
        params.subject_alt_names.push(SanType::URI(
            uri.clone().try_into().map_err(err("identity URI"))?,
        ));
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, uri);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = match identity {
            Identity::Replica { .. } => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            _ => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().map_err(err("key"))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(err("certificate"))?;
        Ok(Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

impl Leaf {
    /// Writes `<stem>.crt` and `<stem>.key` to `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<LeafFiles, String> {
        let cert = write(dir, &format!("{stem}.crt"), &self.cert_pem)?;
        let key = write(dir, &format!("{stem}.key"), &self.key_pem)?;
        Ok(LeafFiles { cert, key })
    }
}

/// The file stem `coord-certs` uses for an identity's certificate.
pub fn stem(identity: &Identity) -> String {
    match identity {
        Identity::Replica { id, .. } => format!("replica-{id}"),
        Identity::Task {
            job,
            index,
            namespace: None,
            ..
        } => format!("task-{job}-{index}"),
        Identity::Task {
            job,
            index,
            namespace: Some(ns),
            ..
        } => format!("ns-{ns}-task-{job}-{index}"),
        Identity::Client { name, .. } => format!("client-{name}"),
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, contents).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    if name.ends_with(".key") {
        restrict(&path)?;
    }
    Ok(path)
}

/// Keys are readable by their owner only.
fn restrict(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {}: {e}", path.display()))
}

/// Whether the PEM certificate's subject common name is `cn`.
fn cert_pem_names(pem: &str, cn: &str) -> Result<bool, String> {
    use rustls_pki_types::pem::PemObject;
    use x509_cert::der::Decode;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| format!("the CA certificate is not PEM: {e}"))?;
    let cert = x509_cert::Certificate::from_der(&der)
        .map_err(|e| format!("the CA certificate cannot be parsed: {e}"))?;
    Ok(cert.tbs_certificate.subject.to_string() == format!("CN={cn}"))
}

//! Who is calling, from the certificate the caller presented over TLS, and what it may do.
//!
//! Without TLS a replica cannot tell callers apart, and every caller may do everything. With TLS
//! (see [`crate::ops::tls`]) the caller's certificate names an [`Identity`]:
//! - Raft traffic is accepted only from replica certificates of this ensemble.
//! - A task certificate acts only as its own task: a call that registers, heartbeats, reports an
//!   error, waits at a barrier or polls for errors *as another task* is refused
//!   `PERMISSION_DENIED`, naming both. A task may not change the membership, take snapshots or
//!   shut the service down.
//! - A task certificate of a namespace (`coord://<ensemble>/ns/<name>/task/...`) acts only in
//!   that namespace; one without acts only in the default namespace.
//! - A certificate of another ensemble, or one without a coord identity, is refused.
//! - A caller without a certificate (allowed with `--tls-client-auth optional`) is held to no
//!   identity.
//!
//! Checks run on the replica the caller reached. A follower forwards an admitted call with its
//! own replica certificate, and the leader trusts what a replica forwards.

use crate::serve::namespace::{self, Ns};
use coord_proto::tls::Identity;
use tonic::{Request, Status};
use x509_cert::der::oid::AssociatedOid;
use x509_cert::der::Decode;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::ext::pkix::SubjectAltName;

/// The caller of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// The port speaks plain gRPC: nobody is authenticated, and nothing is checked.
    Open,
    /// TLS without a client certificate.
    Anonymous,
    /// TLS with a certificate of this ensemble.
    Known(Identity),
}

impl Caller {
    fn describe(&self) -> String {
        match self {
            Caller::Open => "an unauthenticated caller".into(),
            Caller::Anonymous => "a caller without a certificate".into(),
            Caller::Known(id) => format!("{id}"),
        }
    }
}

/// The checks of one replica.
#[derive(Clone, Debug)]
pub struct Authz {
    /// TLS is on: callers are identified by their certificates.
    tls: bool,
    /// This ensemble's name (`--cluster-token`), which identities must carry.
    cluster: String,
}

impl Authz {
    pub fn new(tls: bool, cluster: &str) -> Self {
        Self {
            tls,
            cluster: cluster.to_string(),
        }
    }

    /// Everyone may do everything: a replica without TLS.
    pub fn open() -> Self {
        Self::new(false, "")
    }

    /// Who sent `req`; a certificate that names no identity of this ensemble is refused.
    pub fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        if !self.tls {
            return Ok(Caller::Open);
        }
        let Some(leaf) = req.peer_certs().and_then(|c| c.first().cloned()) else {
            return Ok(Caller::Anonymous);
        };
        let id = identity_of(&leaf).map_err(Status::permission_denied)?;
        if id.cluster() != self.cluster {
            return Err(Status::permission_denied(format!(
                "certificate {id} belongs to ensemble {:?}; this replica serves ensemble {:?}",
                id.cluster(),
                self.cluster
            )));
        }
        Ok(Caller::Known(id))
    }

    /// Refuses everyone but the ensemble's replicas (Raft traffic).
    pub fn replicas_only<T>(&self, req: &Request<T>, what: &str) -> Result<(), Status> {
        match self.caller(req)? {
            Caller::Open | Caller::Known(Identity::Replica { .. }) => Ok(()),
            other => Err(Status::permission_denied(format!(
                "{what} is accepted only from replicas of ensemble {:?}; the caller is {}",
                self.cluster,
                other.describe()
            ))),
        }
    }

    /// Refuses a task certificate acting as any task but its own: `job`/`index` is the task the
    /// request names, in the field `field` of `method`.
    pub fn acting_as<T>(
        &self,
        req: &Request<T>,
        method: &str,
        field: &str,
        job: &str,
        index: i64,
    ) -> Result<(), Status> {
        self.acting_as_with(req, method, field, || Ok((job.to_string(), index)))
    }

    /// [`Self::acting_as`] where finding the task the request names takes work (`named`), done
    /// only when the caller is a task.
    pub fn acting_as_with<T>(
        &self,
        req: &Request<T>,
        method: &str,
        field: &str,
        named: impl FnOnce() -> Result<(String, i64), Status>,
    ) -> Result<(), Status> {
        let Caller::Known(Identity::Task {
            job: own_job,
            index: own,
            ..
        }) = self.caller(req)?
        else {
            return Ok(());
        };
        let (job, index) = named()?;
        if own_job == job && i64::from(own) == index {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "{method}: {field} names task {job}/{index}, but the caller's certificate is task \
             {own_job}/{own}'s; a task may act only as itself"
        )))
    }

    /// The namespace a call acts in, given the one its `coord-namespace` header names: a task
    /// certificate binds its own (a header naming another is refused PERMISSION_DENIED, so a task
    /// of namespace A cannot act in B, nor in the default one); operators, replicas and callers
    /// without TLS act in the one the header names (without TLS the sidecar that sets it is the
    /// trusted party).
    ///
    /// `named` is `None` when the call has no header (`Some(None)`: it names the default one).
    pub fn in_namespace<T>(&self, req: &Request<T>, named: Option<Ns>) -> Result<Ns, Status> {
        let Caller::Known(Identity::Task { namespace: own, .. }) = self.caller(req)? else {
            return Ok(named.flatten());
        };
        let own = namespace::parse(own.as_deref()).map_err(|s| {
            Status::permission_denied(format!(
                "the caller's task certificate names no valid namespace: {}",
                s.message()
            ))
        })?;
        match named {
            None => Ok(own),
            Some(named) if named == own => Ok(own),
            Some(named) => Err(Status::permission_denied(format!(
                "the call names namespace {:?}, but the caller's certificate is a task of namespace {:?}; a task acts only in its own namespace",
                namespace::shown(&named),
                namespace::shown(&own)
            ))),
        }
    }

    /// Whether the caller presented a task's certificate.
    pub fn is_task<T>(&self, req: &Request<T>) -> bool {
        matches!(self.caller(req), Ok(Caller::Known(Identity::Task { .. })))
    }

    /// Refuses tasks: `what` is for operators and replicas.
    pub fn not_a_task<T>(&self, req: &Request<T>, what: &str) -> Result<(), Status> {
        match self.caller(req)? {
            Caller::Known(id @ Identity::Task { .. }) => Err(Status::permission_denied(format!(
                "{what} is not allowed to a task; the caller's certificate is {id}"
            ))),
            _ => Ok(()),
        }
    }

    /// Whether a request marked as forwarded really comes from a replica (without TLS nobody
    /// can tell, and the mark is taken at its word).
    pub fn from_replica<T>(&self, req: &Request<T>) -> bool {
        matches!(
            self.caller(req),
            Ok(Caller::Open | Caller::Known(Identity::Replica { .. }))
        )
    }
}

/// The coord identity a DER certificate carries in its subject alternative names.
pub fn identity_of(der: &[u8]) -> Result<Identity, String> {
    let cert = x509_cert::Certificate::from_der(der)
        .map_err(|e| format!("the caller's certificate cannot be parsed: {e}"))?;
    let mut found: Option<Identity> = None;
    for ext in cert.tbs_certificate.extensions.iter().flatten() {
        if ext.extn_id != SubjectAltName::OID {
            continue;
        }
        let names = SubjectAltName::from_der(ext.extn_value.as_bytes())
            .map_err(|e| format!("the certificate's alternative names cannot be parsed: {e}"))?;
        for name in names.0 {
            let GeneralName::UniformResourceIdentifier(uri) = name else {
                continue;
            };
            if let Some(id) = Identity::parse(uri.as_str())? {
                if let Some(first) = &found {
                    return Err(format!(
                        "the certificate names two coord identities, {first} and {id}"
                    ));
                }
                found = Some(id);
            }
        }
    }
    found.ok_or_else(|| {
        "the certificate names no coord identity (a URI alternative name \
         coord://<ensemble>/replica|task|client/...)"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;

    /// A task certificate made by `coord-certs` (worker 0 of ensemble "coord").
    const TASK_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBujCCAWCgAwIBAgIUe1bg0PJTbGh3XcX/vHJiJ2tFm58wCgYIKoZIzj0EAwIw
IDEeMBwGA1UEAwwVY29vcmQgdGVzdCBDQSAoY29vcmQpMCAXDTc1MDEwMTAwMDAw
MFoYDzQwOTYwMTAxMDAwMDAwWjAmMSQwIgYDVQQDDBtjb29yZDovL2Nvb3JkL3Rh
c2svd29ya2VyLzAwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQC0cha05tY3HSh
e6O7Czp76WK6oLMl7/QjCTOY1viZOkV93r9UbyfEaNe2yaYg7LNNaVaFlKqWIQNn
jxCSArdto3AwbjAfBgNVHSMEGDAWgBRU+IJlk7LNCHijIefdRgUujIKRpDAmBgNV
HREEHzAdhhtjb29yZDovL2Nvb3JkL3Rhc2svd29ya2VyLzAwDgYDVR0PAQH/BAQD
AgeAMBMGA1UdJQQMMAoGCCsGAQUFBwMCMAoGCCqGSM49BAMCA0gAMEUCIQColrLc
UFhRyKYLjJePmHVKGqPAIWJFNm5vUUOfWoz36AIgPrcZvy5PS/QsuklvEHTI4y56
brOmZ/H7QVdJoF6d2zg=
-----END CERTIFICATE-----
";

    fn der() -> Vec<u8> {
        rustls_pki_types::CertificateDer::from_pem_slice(TASK_CERT.as_bytes())
            .expect("fixture")
            .to_vec()
    }

    #[test]
    fn a_certificate_names_its_identity() {
        assert_eq!(
            identity_of(&der()),
            Ok(Identity::Task {
                cluster: "coord".into(),
                job: "worker".into(),
                index: 0,
                namespace: None,
            })
        );
        let err = identity_of(b"not a certificate").expect_err("garbage");
        assert!(err.contains("cannot be parsed"), "{err}");
    }

    /// Damaged certificates never panic the parser, and what it accepts is still a coord
    /// identity. (A damaged certificate never gets this far in a replica: the TLS handshake
    /// checks its signature first.)
    #[test]
    fn fuzz_damaged_certificates() {
        let good = der();
        let mut next = coord_proto::fuzz::xorshift(0xC0DE_7157);
        for _ in 0..20_000 {
            let mut bytes = good.clone();
            let flips = 1 + next() % 8;
            for _ in 0..flips {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            if next().is_multiple_of(4) {
                bytes.truncate((next() % bytes.len() as u64) as usize);
            }
            if let Ok(id) = identity_of(&bytes) {
                assert_eq!(Identity::parse(&id.to_string()), Ok(Some(id)));
            }
        }
    }
}

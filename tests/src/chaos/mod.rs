//! Fault injection and checking: the ensemble under a seeded schedule of crashes, pauses and
//! partitions, with clients recording what they saw, and checkers that judge the record.
//!
//! - [`netproxy`]: cuts links between replicas, per direction.
//! - [`schedule`]: seeded fault schedules (a schedule is a function of its seed).
//! - [`workload`]: the clients, which record every call.
//! - [`raw_clients`]: the workload's raw-key clients (torch's store operations, as coord-proxy
//!   calls them).
//! - [`linearize`]: the linearizability checker and the key-value model.
//! - [`raw`]: the raw-key (torch store) operations recorded, and the exactly-once checks.
//! - [`history`]: what the clients recorded, and the checks run on it.
//! - [`recovery`]: once the faults have healed, every call completes within a bound.
//! - [`runner`]: one run: ensemble, workload, faults, healing, final reads, checks, and the
//!   record of a failed run.
//! - [`crash`]: the crash-consistency loop (kill -9 one or all replicas under load, restart,
//!   verify).

use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tls::ClientTls;

use crate::cluster::Cluster;

pub mod alive;
pub mod alive_clients;
pub mod crash;
pub mod history;
pub mod linearize;
pub mod netproxy;
pub mod raw;
pub mod raw_clients;
pub mod recovery;
pub mod runner;
pub mod schedule;
pub mod workload;

/// The ensemble the clients of a run call: its endpoints and, for a TLS ensemble, an operator's
/// certificate (`--tls` of `coord-bench chaos` and `crash`).
#[derive(Clone)]
pub struct Endpoints {
    pub endpoints: Vec<String>,
    pub tls: Option<ClientTls>,
    /// The namespace the clients act in (`None`: the default one).
    pub namespace: Option<String>,
}

impl Endpoints {
    /// `cluster`'s endpoints, over TLS when it serves TLS.
    pub fn of(cluster: &Cluster, tls: bool) -> Self {
        Self {
            endpoints: cluster.endpoints(),
            tls: tls.then(|| {
                let pki = cluster.pki();
                pki.client(Some(&pki.client_identity("chaos")))
            }),
            namespace: None,
        }
    }

    /// The same replicas, with the clients acting in namespace `name`.
    pub fn in_namespace(&self, name: &str) -> Self {
        Self {
            namespace: Some(name.to_string()),
            ..self.clone()
        }
    }

    /// A client that fails a call only after no replica could serve it for `unavailable_after`.
    pub fn client(&self, unavailable_after: Duration) -> CoordClient {
        let mut o = ClientOptions::new(self.endpoints.clone());
        o.unavailable_after = unavailable_after;
        o.tls = self.tls.clone();
        o.namespace = self.namespace.clone();
        CoordClient::new(o).expect("client")
    }
}

/// Resolves once a run is stopping (`stop` set).
pub(crate) async fn stopped(stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

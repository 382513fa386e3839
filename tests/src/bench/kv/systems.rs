//! The systems a run measures and how each is started: the coord ensembles (the first on the
//! segment log or at `--endpoints`, then `--tls`'s and `--sled`'s) and the etcd clusters, and the
//! [`Lane`] through which a workload runs on one of them.

use std::sync::Arc;
use std::time::Duration;

use coord_proto::tls::ClientTls;

use super::plan::{Args, Workload, COORD, ETCD, ETCD_TLS, SLED, TLS};
use crate::bench::coord_target::{CoordTarget, RaftLog};
use crate::bench::etcd::{ensure_etcd, EtcdCluster, EtcdTarget};
use crate::bench::load::{self, LoadResult};
use crate::bench::KvTarget;
use crate::{Cluster, ClusterOptions};

/// Runs `w` once against `target` (warm-up first) and logs the result.
pub(super) async fn run_once<T: KvTarget>(name: &str, w: &Workload, target: Arc<T>) -> LoadResult {
    load::run(
        target.clone(),
        w.kind,
        w.clients,
        (w.ops / 20).max(w.clients),
    )
    .await;
    let r = load::run(target, w.kind, w.clients, w.ops).await;
    eprintln!(
        "{name:8} {:32} {:>9.0} ops/s  p50 {:>8.2?}  p99 {:>8.2?}  errors {}",
        w.name,
        r.ops_per_sec(),
        r.p50,
        r.p99,
        r.errors
    );
    r
}

/// A coord ensemble measured in the rounds. The first is the ensemble at `--endpoints` or one
/// started here on the segment log; `--tls` and `--sled` each add a second one, started by the
/// same code with one difference (TLS, or `--raft-log sled`).
pub(super) struct CoordSystem {
    pub(super) label: &'static str,
    /// `None` for an ensemble at `--endpoints`.
    pub(super) cluster: Option<Cluster>,
    pub(super) endpoints: Vec<String>,
    /// What the clients present to a TLS ensemble.
    pub(super) client_tls: Option<ClientTls>,
}

impl CoordSystem {
    pub(super) async fn start(
        args: &Args,
        label: &'static str,
        tls: bool,
        engine: RaftLog,
    ) -> Result<Self, String> {
        let cluster = start_coord(args, tls, engine).await?;
        let client_tls = tls.then(|| {
            let pki = cluster.pki();
            pki.client(Some(&pki.client_identity("bench")))
        });
        Ok(Self {
            label,
            endpoints: cluster.endpoints(),
            cluster: Some(cluster),
            client_tls,
        })
    }

    pub(super) async fn target(&self, connections: usize) -> Result<Arc<CoordTarget>, String> {
        Ok(Arc::new(
            CoordTarget::connect_with(self.endpoints.clone(), connections, self.client_tls.clone())
                .await?,
        ))
    }
}

/// One system's clients for one workload.
pub(super) enum Lane {
    Coord(Arc<CoordTarget>),
    Etcd(Arc<EtcdTarget>),
}

impl Lane {
    pub(super) async fn preload(&self) -> Result<(), String> {
        match self {
            Lane::Coord(t) => load::preload(t).await,
            Lane::Etcd(t) => load::preload(t).await,
        }
    }

    pub(super) async fn run_once(&self, label: &str, w: &Workload) -> LoadResult {
        match self {
            Lane::Coord(t) => run_once(label, w, t.clone()).await,
            Lane::Etcd(t) => run_once(label, w, t.clone()).await,
        }
    }
}

/// Starts three replicas on this machine with the log on `engine`, and waits for a leader.
pub(super) async fn start_coord(
    args: &Args,
    tls: bool,
    engine: RaftLog,
) -> Result<Cluster, String> {
    // Three replicas share this machine's cores, so each gets one runtime thread (as the local
    // ensemble script does); --coord-arg can override it, and the log engine unless `--sled`.
    let given = |flag: &str| args.coord_args.iter().any(|a| a.starts_with(flag));
    let mut extra_args = Vec::new();
    if !given("--worker-threads") {
        extra_args.extend(["--worker-threads".to_string(), "1".to_string()]);
    }
    if !given("--raft-log") {
        extra_args.extend(engine.args());
    }
    extra_args.extend(args.coord_args.iter().cloned());
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args,
        log_filter: "warn".into(),
        tls,
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    Ok(cluster)
}

pub(super) fn coord_term(cluster: &mut Option<Cluster>) -> Option<(u64, u64)> {
    let c = cluster.as_mut()?;
    c.ids()
        .into_iter()
        .find_map(|id| c.status(id).and_then(|s| Some((s.term, s.leader_id?))))
}

/// The coord ensembles: the first, then `--tls`'s and `--sled`'s.
pub(super) async fn start_coords(args: &Args) -> Result<Vec<CoordSystem>, String> {
    if !args.endpoints.is_empty() {
        for (flag, on) in [("--tls", args.tls), ("--sled", args.sled)] {
            if on {
                return Err(format!(
                    "{flag} starts an ensemble of its own; it does not go with --endpoints"
                ));
            }
        }
    }
    if args.sled && args.coord_args.iter().any(|a| a.starts_with("--raft-log")) {
        return Err("--sled sets each ensemble's --raft-log; leave it out of --coord-arg".into());
    }
    let mut systems = Vec::new();
    if args.endpoints.is_empty() {
        systems.push(CoordSystem::start(args, COORD, false, RaftLog::Segments).await?);
    } else {
        systems.push(CoordSystem {
            label: COORD,
            cluster: None,
            endpoints: args.endpoints.clone(),
            client_tls: None,
        });
    }
    if args.tls {
        systems.push(CoordSystem::start(args, TLS, true, RaftLog::Segments).await?);
    }
    if args.sled {
        systems.push(CoordSystem::start(args, SLED, false, RaftLog::Sled).await?);
    }
    Ok(systems)
}

/// The etcd clusters: plain, and serving TLS with `--tls`; none with `--skip-etcd`. They start
/// one after the other, each waiting for its leader, as the coord ensembles do.
pub(super) async fn start_etcd(args: &Args) -> Result<Vec<(&'static str, EtcdCluster)>, String> {
    if args.skip_etcd {
        return Ok(Vec::new());
    }
    let binary = ensure_etcd(!args.no_install)?;
    let plain = EtcdCluster::start(binary.clone(), 3)?;
    plain.wait_for_leader(Duration::from_secs(60)).await?;
    if !args.tls {
        return Ok(vec![(ETCD, plain)]);
    }
    let tls = EtcdCluster::start_tls(binary, 3)?;
    tls.wait_for_leader(Duration::from_secs(60))
        .await
        .map_err(|e| format!("etcd over TLS: {e}"))?;
    Ok(vec![(ETCD, plain), (ETCD_TLS, tls)])
}

//! `coord.admin.Namespaces`: declaring, deleting and listing namespaces (coord-proxy
//! `--namespace` declares its own on first contact; `coordctl ns` does all three).
//!
//! These calls name the namespace they act on in the request, so they run outside every
//! namespace; over TLS a task's certificate may declare only its own namespace, with at most the
//! ensemble's default limits, and may neither delete nor list.

use std::sync::Arc;

use coord_proto::coord::admin as pb;
use coord_proto::coord::admin::namespaces_client::NamespacesClient;
use coord_raft_store::state::{ClusterConfig, NamespaceLimits, Space, TaskState};
use coord_raft_store::storage::StateReader;
use coord_raft_store::{Command, Op, Output};
use tonic::{Request, Response, Status};

use crate::error::CoordError;
use crate::serve::apply_hub::ApplyHub;
use crate::serve::coordination::CoordCore;
use crate::serve::namespace;
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;
use crate::serve::route::{Kind, Router};

pub struct NamespacesService {
    router: Arc<Router>,
    proposer: Proposer,
    read_index: ReadIndex,
    reader: StateReader,
    hub: Arc<ApplyHub>,
    /// What a declaration gets for the limits it leaves 0.
    defaults: NamespaceLimits,
}

impl NamespacesService {
    pub fn new(router: Arc<Router>, core: &CoordCore, defaults: NamespaceLimits) -> Self {
        Self {
            router,
            proposer: core.proposer.clone(),
            read_index: core.read_index.clone(),
            reader: core.reader.all().clone(),
            hub: core.hub.clone(),
            defaults,
        }
    }
}

fn config_of(shape: Option<pb::NamespaceShape>) -> ClusterConfig {
    let s = shape.unwrap_or_default();
    ClusterConfig {
        jobs: s.jobs.into_iter().collect(),
        heartbeat_timeout_ms: s.heartbeat_timeout_ms,
        register_timeout_ms: s.register_timeout_ms,
        shutdown_barrier_timeout_ms: s.shutdown_barrier_timeout_ms,
        recoverable_jobs: s.recoverable_jobs.into_iter().collect(),
    }
}

fn shape_of(c: &ClusterConfig) -> pb::NamespaceShape {
    pb::NamespaceShape {
        jobs: c.jobs.clone().into_iter().collect(),
        heartbeat_timeout_ms: c.heartbeat_timeout_ms,
        register_timeout_ms: c.register_timeout_ms,
        shutdown_barrier_timeout_ms: c.shutdown_barrier_timeout_ms,
        recoverable_jobs: c.recoverable_jobs.iter().cloned().collect(),
    }
}

fn limits_to_wire(l: &NamespaceLimits) -> pb::NamespaceLimits {
    pb::NamespaceLimits {
        max_bytes: l.max_bytes,
        max_keys: l.max_keys,
        max_tasks: l.max_tasks,
        max_parked: l.max_parked,
        writes_per_sec: l.writes_per_sec,
        write_burst: l.write_burst,
        ttl_ms: l.ttl_ms,
    }
}

/// The limits asked for, each 0 filled in from `defaults`.
fn limits_from_wire(
    asked: Option<pb::NamespaceLimits>,
    defaults: &NamespaceLimits,
) -> NamespaceLimits {
    let a = asked.unwrap_or_default();
    let or = |v: u64, d: u64| if v == 0 { d } else { v };
    NamespaceLimits {
        max_bytes: or(a.max_bytes, defaults.max_bytes),
        max_keys: or(a.max_keys, defaults.max_keys),
        max_tasks: or(a.max_tasks, defaults.max_tasks),
        max_parked: or(a.max_parked, defaults.max_parked),
        writes_per_sec: or(a.writes_per_sec, defaults.writes_per_sec),
        write_burst: or(a.write_burst, defaults.write_burst),
        ttl_ms: or(a.ttl_ms, defaults.ttl_ms),
    }
}

/// The limits of `asked` above `defaults` ("no limit" is above any), for a task's refusal.
fn above(asked: &NamespaceLimits, defaults: &NamespaceLimits) -> Vec<&'static str> {
    let over = |a: u64, d: u64| d != 0 && (a == 0 || a > d);
    [
        ("max_bytes", asked.max_bytes, defaults.max_bytes),
        ("max_keys", asked.max_keys, defaults.max_keys),
        ("max_tasks", asked.max_tasks, defaults.max_tasks),
        ("max_parked", asked.max_parked, defaults.max_parked),
        (
            "writes_per_sec",
            asked.writes_per_sec,
            defaults.writes_per_sec,
        ),
        ("ttl_ms", asked.ttl_ms, defaults.ttl_ms),
    ]
    .into_iter()
    .filter(|(_, a, d)| over(*a, *d))
    .map(|(name, ..)| name)
    .collect()
}

/// One namespace's listing row.
fn row(
    name: &str,
    space: &Space,
    limits: NamespaceLimits,
    created_at_ms: u64,
    parked: u64,
) -> pb::NamespaceRow {
    let (tasks, connected, config) = match &space.cluster {
        Some(c) => (
            c.config.task_count() as u64,
            c.tasks.count_in(TaskState::Connected) as u64,
            c.config.clone(),
        ),
        None => (0, 0, ClusterConfig::default()),
    };
    pb::NamespaceRow {
        name: name.to_string(),
        shape: Some(shape_of(&config)),
        limits: Some(limits_to_wire(&limits)),
        bytes: space.usage(),
        keys: space.key_count(),
        tasks,
        connected_tasks: connected,
        parked,
        created_at_ms,
    }
}

impl NamespacesService {
    /// Commits `op`, which acts on namespaces, outside every namespace.
    async fn commit(
        &self,
        request: Option<coord_raft_store::RequestId>,
        op: Op,
    ) -> Result<Output, CoordError> {
        let result =
            namespace::within(None, self.proposer.propose(Command { request, op })).await?;
        Ok(result?)
    }
}

#[tonic::async_trait]
impl pb::namespaces_server::Namespaces for NamespacesService {
    async fn declare(
        &self,
        req: Request<pb::DeclareNamespaceRequest>,
    ) -> Result<Response<pb::DeclareNamespaceReply>, Status> {
        let name = namespace::parse(Some(&req.get_ref().name))?;
        if name.is_none() {
            return Err(Status::invalid_argument(
                "namespace \"default\" is the replicas' own, shaped by their flags: it cannot be declared",
            ));
        }
        // A task's certificate declares only its own namespace, within the default limits.
        let authz = self.router.authz();
        let check = authz.in_namespace(&req, Some(name.clone())).map(|_| ());
        self.router.checked("namespaces/Declare", check)?;
        let asked = limits_from_wire(req.get_ref().limits, &self.defaults);
        let over = above(&asked, &self.defaults);
        if authz.is_task(&req) && !over.is_empty() {
            let s = Status::permission_denied(format!(
                "a task's certificate may declare namespace {:?} with at most the ensemble's default limits; {} asked above them",
                namespace::shown(&name),
                over.join(", ")
            ));
            self.router.checked("namespaces/Declare", Err(s))?;
        }
        self.router
            .route(
                "namespaces/Declare",
                Kind::Write,
                req,
                |m, id| async move {
                    let limits = limits_from_wire(m.limits, &self.defaults);
                    let op = Op::DeclareNamespace {
                        namespace: m.name,
                        config: config_of(m.shape),
                        limits,
                        service_incarnation: rand::random::<u64>() | 1,
                    };
                    match self.commit(id, op).await? {
                        Output::Declared { created, .. } => Ok(pb::DeclareNamespaceReply {
                            created,
                            limits: Some(limits_to_wire(&limits)),
                        }),
                        other => Err(CoordError::Internal(format!("declare returned {other:?}"))),
                    }
                },
                |ch, r| async move { NamespacesClient::new(ch).declare(r).await },
            )
            .await
    }

    async fn delete(
        &self,
        req: Request<pb::DeleteNamespaceRequest>,
    ) -> Result<Response<pb::DeleteNamespaceReply>, Status> {
        let check = self.router.authz().not_a_task(&req, "deleting a namespace");
        self.router.checked("namespaces/Delete", check)?;
        self.router
            .route(
                "namespaces/Delete",
                Kind::Write,
                req,
                |m, id| async move {
                    self.commit(id, Op::DeleteNamespace { namespace: m.name })
                        .await?;
                    Ok(pb::DeleteNamespaceReply {})
                },
                |ch, r| async move { NamespacesClient::new(ch).delete(r).await },
            )
            .await
    }

    async fn list(
        &self,
        req: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesReply>, Status> {
        let check = self.router.authz().not_a_task(&req, "listing namespaces");
        self.router.checked("namespaces/List", check)?;
        self.router
            .route(
                "namespaces/List",
                Kind::Read,
                req,
                |_, _| async move {
                    self.read_index.linearize().await?;
                    let parked = |ns: &namespace::Ns| self.hub.budget.used_in(ns) as u64;
                    let namespaces = self.reader.read(|a| {
                        let default = row(
                            coord_raft_store::state::DEFAULT_NAMESPACE,
                            &a.state.default,
                            NamespaceLimits::default(),
                            0,
                            parked(&None),
                        );
                        let named = a.state.namespaces.iter().map(|(name, n)| {
                            row(
                                name,
                                &n.space,
                                n.limits,
                                n.created_at_ms,
                                parked(&Some(name.as_str().into())),
                            )
                        });
                        std::iter::once(default).chain(named).collect()
                    });
                    Ok(pb::ListNamespacesReply { namespaces })
                },
                |ch, r| async move { NamespacesClient::new(ch).list(r).await },
            )
            .await
    }
}

//! A replica's view of the ensemble, from openraft's metrics: served as JSON on `/status` and as
//! `coord.admin.Admin/Status`.

use coord_proto::coord::admin as pb;
use coord_raft_store::state::TaskState;
use coord_raft_store::types::{NodeId, Raft};
use openraft::ServerState;
use serde::Serialize;

#[derive(Serialize, Debug, Clone)]
pub struct ReplicaStatus {
    pub id: NodeId,
    pub leader_id: Option<NodeId>,
    pub state: String,
    pub term: u64,
    pub last_log_index: u64,
    pub last_applied: u64,
    pub snapshot_index: u64,
    pub purged_index: u64,
    pub members: Vec<MemberStatus>,
    /// Leader only: ms since a quorum last acknowledged it.
    pub millis_since_quorum_ack: Option<u64>,
}

#[derive(Serialize, Debug, Clone)]
pub struct MemberStatus {
    pub id: NodeId,
    pub addr: String,
    pub voter: bool,
    /// Leader only: the last index known to be on that member.
    pub matched_index: Option<u64>,
}

/// A task state as coordctl and the status page print it (TensorFlow's names, without prefix).
pub fn task_state_name(s: TaskState) -> &'static str {
    match s {
        TaskState::Disconnected => "DISCONNECTED",
        TaskState::Connected => "CONNECTED",
        TaskState::Error => "ERROR",
    }
}

pub fn state_name(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "Leader",
        ServerState::Follower => "Follower",
        ServerState::Candidate => "Candidate",
        ServerState::Learner => "Learner",
        ServerState::Shutdown => "Shutdown",
    }
}

impl ReplicaStatus {
    pub fn of(raft: &Raft) -> Self {
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| MemberStatus {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
                matched_index: m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(id))
                    .map(|l| l.map_or(0, |l| l.index)),
            })
            .collect();
        Self {
            id: m.id,
            leader_id: m.current_leader,
            state: state_name(m.state).to_string(),
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            last_applied: m.last_applied.map_or(0, |l| l.index),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            members,
            millis_since_quorum_ack: m.millis_since_quorum_ack,
        }
    }

    pub fn to_proto(&self) -> pb::StatusReply {
        pb::StatusReply {
            id: self.id,
            leader_id: self.leader_id,
            term: self.term,
            last_log_index: self.last_log_index,
            last_applied: self.last_applied,
            state: self.state.clone(),
            members: self
                .members
                .iter()
                .map(|m| pb::Member {
                    id: m.id,
                    addr: m.addr.clone(),
                    voter: m.voter,
                    matched_index: m.matched_index,
                })
                .collect(),
            millis_since_quorum_ack: self.millis_since_quorum_ack,
            snapshot_index: self.snapshot_index,
            purged_index: self.purged_index,
        }
    }
}

/// `coord.admin.Admin`: `Status` is answered by any replica from its own view; `ShutdownService`
/// is routed to the leader like any write.
pub struct AdminService {
    raft: Raft,
    router: std::sync::Arc<crate::route::Router>,
    core: std::sync::Arc<crate::coordination::CoordCore>,
    membership: crate::membership::MembershipAdmin,
}

impl AdminService {
    pub fn new(
        raft: Raft,
        router: std::sync::Arc<crate::route::Router>,
        core: std::sync::Arc<crate::coordination::CoordCore>,
        membership: crate::membership::MembershipAdmin,
    ) -> Self {
        Self {
            raft,
            router,
            core,
            membership,
        }
    }

    /// Over TLS, refuses a task's certificate: `method` is for operators.
    fn not_a_task<T>(
        &self,
        req: &tonic::Request<T>,
        method: &'static str,
    ) -> Result<(), tonic::Status> {
        let check = self.router.authz().not_a_task(req, method);
        self.router.checked(method, check)
    }

    /// The membership as this replica sees it (after a change, on the leader: the new one).
    fn members(&self) -> pb::MembershipReply {
        pb::MembershipReply {
            members: ReplicaStatus::of(&self.raft).to_proto().members,
        }
    }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn status(
        &self,
        _: tonic::Request<pb::StatusRequest>,
    ) -> Result<tonic::Response<pb::StatusReply>, tonic::Status> {
        Ok(tonic::Response::new(
            ReplicaStatus::of(&self.raft).to_proto(),
        ))
    }

    async fn tasks(
        &self,
        req: tonic::Request<pb::TasksRequest>,
    ) -> Result<tonic::Response<pb::TasksReply>, tonic::Status> {
        let core = &*self.core;
        self.router
            .route(
                "Tasks",
                crate::route::Kind::Read,
                req,
                |_, _| async move {
                    let (service_incarnation, records) = core.task_states(Vec::new()).await?;
                    let tasks = records
                        .into_iter()
                        .map(|(t, r)| pb::TaskRow {
                            heartbeat_age_ms: (r.state == TaskState::Connected)
                                .then(|| core.heartbeats.age(&t, r.incarnation))
                                .flatten()
                                .map(|d| d.as_millis() as u64),
                            job: t.job,
                            task: t.task,
                            state: task_state_name(r.state).to_string(),
                            incarnation: r.incarnation,
                            error_code: r.error.as_ref().map_or(0, |e| e.code as i32),
                            error_message: r.error.map_or_else(String::new, |e| e.message),
                        })
                        .collect();
                    Ok(pb::TasksReply {
                        service_incarnation,
                        tasks,
                    })
                },
                |ch, r| async move { pb::admin_client::AdminClient::new(ch).tasks(r).await },
            )
            .await
    }

    async fn barriers(
        &self,
        req: tonic::Request<pb::BarriersRequest>,
    ) -> Result<tonic::Response<pb::BarriersReply>, tonic::Status> {
        let core = &*self.core;
        self.router
            .route(
                "Barriers",
                crate::route::Kind::Read,
                req,
                |_, _| async move {
                    let now_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as i64);
                    let barriers = core
                        .open_barriers()
                        .await?
                        .into_iter()
                        .map(|(b, missing)| pb::BarrierRow {
                            ms_left: b.deadline_ms.map(|d| d as i64 - now_ms),
                            deadline_ms: b.deadline_ms,
                            id: b.id,
                            counter: b.counter,
                            arrived: b.arrived.iter().map(ToString::to_string).collect(),
                            missing: missing.iter().map(ToString::to_string).collect(),
                        })
                        .collect();
                    Ok(pb::BarriersReply { barriers })
                },
                |ch, r| async move { pb::admin_client::AdminClient::new(ch).barriers(r).await },
            )
            .await
    }

    /// Not routed: every replica snapshots its own state.
    async fn snapshot(
        &self,
        req: tonic::Request<pb::SnapshotRequest>,
    ) -> Result<tonic::Response<pb::SnapshotReply>, tonic::Status> {
        self.not_a_task(&req, "Snapshot")?;
        let applied = ReplicaStatus::of(&self.raft).last_applied;
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| tonic::Status::internal(format!("cannot trigger a snapshot: {e}")))?;
        let waited = self
            .raft
            .wait(Some(std::time::Duration::from_secs(60)))
            .metrics(
                |m| m.snapshot.is_some_and(|s| s.index >= applied),
                "snapshot taken",
            )
            .await;
        match waited {
            Ok(m) => Ok(tonic::Response::new(pb::SnapshotReply {
                snapshot_index: m.snapshot.map_or(0, |s| s.index),
            })),
            Err(e) => Err(tonic::Status::deadline_exceeded(format!(
                "the snapshot of index {applied} did not complete: {e}"
            ))),
        }
    }

    async fn add_member(
        &self,
        req: tonic::Request<pb::AddMemberRequest>,
    ) -> Result<tonic::Response<pb::MembershipReply>, tonic::Status> {
        self.not_a_task(&req, "AddMember")?;
        let this = self;
        self.router
            .route(
                "AddMember",
                crate::route::Kind::Read,
                req,
                |m, _| async move {
                    this.membership.add(m.id, m.addr).await?;
                    Ok(this.members())
                },
                |ch, r| async move { pb::admin_client::AdminClient::new(ch).add_member(r).await },
            )
            .await
    }

    async fn remove_member(
        &self,
        req: tonic::Request<pb::RemoveMemberRequest>,
    ) -> Result<tonic::Response<pb::MembershipReply>, tonic::Status> {
        self.not_a_task(&req, "RemoveMember")?;
        let this = self;
        self.router
            .route(
                "RemoveMember",
                crate::route::Kind::Read,
                req,
                |m, _| async move {
                    this.membership.remove(m.id).await?;
                    Ok(this.members())
                },
                |ch, r| async move {
                    pb::admin_client::AdminClient::new(ch)
                        .remove_member(r)
                        .await
                },
            )
            .await
    }

    async fn shutdown_service(
        &self,
        req: tonic::Request<pb::ShutdownServiceRequest>,
    ) -> Result<tonic::Response<pb::ShutdownServiceReply>, tonic::Status> {
        self.not_a_task(&req, "ShutdownService")?;
        let core = &*self.core;
        self.router
            .route(
                "ShutdownService",
                crate::route::Kind::Write,
                req,
                |m, id| async move {
                    core.shutdown_service(id, m.reason).await?;
                    Ok(pb::ShutdownServiceReply {})
                },
                |ch, r| async move {
                    pb::admin_client::AdminClient::new(ch)
                        .shutdown_service(r)
                        .await
                },
            )
            .await
    }
}

//! `coord.admin.Admin`: what `coordctl` asks of the ensemble. `Status` is answered by any replica
//! from its own view; tasks and barriers are read on the leader; snapshots, membership changes
//! and `ShutdownService` are routed like any call.

use coord_proto::coord::admin as pb;
use coord_raft_store::state::TaskState;
use coord_raft_store::types::Raft;

use crate::ops::status::ReplicaStatus;

/// `coord.admin.Admin`: `Status` is answered by any replica from its own view; `ShutdownService`
/// is routed to the leader like any write.
pub struct AdminService {
    raft: Raft,
    router: std::sync::Arc<crate::serve::route::Router>,
    core: std::sync::Arc<crate::serve::coordination::CoordCore>,
    membership: crate::raft::membership::MembershipAdmin,
    /// Who leads, and this ensemble's cluster id, for backups.
    leader: crate::raft::leader::LeaderWatch,
    cluster_id: u64,
    elections: Elections,
}

/// What the admin service needs of elections: the leader handoff, and what a pre-vote answer
/// reads (when this replica last heard from a leader, the lease).
pub struct Elections {
    pub handoff: crate::raft::handoff::Handoff,
    pub contact: std::sync::Arc<crate::raft::election::LeaderContact>,
    pub lease: std::time::Duration,
}

impl AdminService {
    pub fn new(
        raft: Raft,
        router: std::sync::Arc<crate::serve::route::Router>,
        core: std::sync::Arc<crate::serve::coordination::CoordCore>,
        membership: crate::raft::membership::MembershipAdmin,
        leader: crate::raft::leader::LeaderWatch,
        cluster_id: u64,
        elections: Elections,
    ) -> Self {
        Self {
            raft,
            router,
            core,
            membership,
            leader,
            cluster_id,
            elections,
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

    /// Refuses `method` (replica-to-replica election traffic) to anything but a replica of
    /// this ensemble.
    fn replicas_only<T>(&self, req: &tonic::Request<T>, method: &str) -> Result<(), tonic::Status> {
        if self.router.authz().from_replica(req) {
            return Ok(());
        }
        Err(tonic::Status::permission_denied(format!(
            "{method} is for replicas of this ensemble only"
        )))
    }

    /// The membership as this replica sees it (after a change, on the leader: the new one).
    fn members(&self) -> pb::MembershipReply {
        pb::MembershipReply {
            members: ReplicaStatus::of(&self.raft, self.core.reader.all())
                .to_proto()
                .members,
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
            ReplicaStatus::of(&self.raft, self.core.reader.all()).to_proto(),
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
                crate::serve::route::Kind::Read,
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
                            state: r.state.name().to_string(),
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
                crate::serve::route::Kind::Read,
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
    type BackupStream = crate::api::backup::BackupStream;

    async fn transfer_leader(
        &self,
        req: tonic::Request<pb::TransferLeaderRequest>,
    ) -> Result<tonic::Response<pb::TransferLeaderReply>, tonic::Status> {
        self.not_a_task(&req, "TransferLeader")?;
        let leadership = self.leader.current();
        if leadership != crate::raft::leader::Leadership::Me {
            return Err(crate::error::CoordError::NotLeader {
                me: self.raft.metrics().borrow().id,
                leader: leadership.hint(),
            }
            .into());
        }
        let to = req.into_inner().to;
        match self.elections.handoff.run(to).await {
            Ok((leader, took)) => Ok(tonic::Response::new(pb::TransferLeaderReply {
                leader,
                millis: took.as_millis() as u64,
            })),
            Err(e) => Err(tonic::Status::failed_precondition(format!(
                "leadership was not handed over: {e}"
            ))),
        }
    }

    async fn pre_vote(
        &self,
        req: tonic::Request<pb::PreVoteRequest>,
    ) -> Result<tonic::Response<pb::PreVoteReply>, tonic::Status> {
        self.replicas_only(&req, "PreVote")?;
        let e = &self.elections;
        Ok(tonic::Response::new(
            crate::raft::election::answer_pre_vote(&self.raft, &e.contact, e.lease, req.get_ref()),
        ))
    }

    async fn campaign(
        &self,
        req: tonic::Request<pb::CampaignRequest>,
    ) -> Result<tonic::Response<pb::CampaignReply>, tonic::Status> {
        self.replicas_only(&req, "Campaign")?;
        let req = req.into_inner();
        let m = self.raft.metrics().borrow().clone();
        let mine = m.last_log_index.unwrap_or(0);
        if mine < req.leader_last_log_index {
            return Err(tonic::Status::failed_precondition(format!(
                "replica {} holds the log to index {mine}, leader {}'s reaches {}: it cannot win",
                m.id, req.leader, req.leader_last_log_index
            )));
        }
        tracing::info!(
            from = req.leader,
            "campaigning: the leader is handing leadership over"
        );
        self.raft
            .trigger()
            .elect()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("cannot campaign: {e}")))?;
        Ok(tonic::Response::new(pb::CampaignReply {}))
    }

    async fn backup(
        &self,
        req: tonic::Request<pb::BackupRequest>,
    ) -> Result<tonic::Response<Self::BackupStream>, tonic::Status> {
        self.not_a_task(&req, "Backup")?;
        let me = self.raft.metrics().borrow().id;
        crate::api::backup::take(&self.core, &self.leader, me, self.cluster_id)
            .await
            .map(tonic::Response::new)
    }

    async fn snapshot(
        &self,
        req: tonic::Request<pb::SnapshotRequest>,
    ) -> Result<tonic::Response<pb::SnapshotReply>, tonic::Status> {
        self.not_a_task(&req, "Snapshot")?;
        let applied = ReplicaStatus::of(&self.raft, self.core.reader.all()).last_applied;
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
                crate::serve::route::Kind::Read,
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
                crate::serve::route::Kind::Read,
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
                crate::serve::route::Kind::Write,
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

    async fn end_run(
        &self,
        req: tonic::Request<pb::EndRunRequest>,
    ) -> Result<tonic::Response<pb::EndRunReply>, tonic::Status> {
        self.not_a_task(&req, "EndRun")?;
        let core = &*self.core;
        self.router
            .route(
                "EndRun",
                crate::serve::route::Kind::Write,
                req,
                |m, id| async move {
                    let run = core.end_run(id, m.reason).await?;
                    Ok(pb::EndRunReply { run })
                },
                |ch, r| async move { pb::admin_client::AdminClient::new(ch).end_run(r).await },
            )
            .await
    }
}

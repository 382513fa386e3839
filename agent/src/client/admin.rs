//! The ensemble's administration through [`CoordClient`]: replica status, membership, tasks,
//! barriers, snapshots, service shutdown (`coord.admin.Admin`).

use std::time::Duration;

use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::{
    AddMemberRequest, BackupChunk, BackupRequest, BarriersReply, BarriersRequest, Member,
    RemoveMemberRequest, ShutdownServiceRequest, SnapshotRequest, StatusReply, StatusRequest,
    TasksReply, TasksRequest, TransferLeaderReply, TransferLeaderRequest,
};
use tonic::{Code, Request, Status};

use super::CoordClient;

/// How long the leader may take to copy and encode the state before a backup's first piece.
const BACKUP_START_TIMEOUT: Duration = Duration::from_secs(120);

impl CoordClient {
    /// One replica's own view of the ensemble (`coord.admin.Admin/Status`), no retries.
    pub async fn status_of(&self, replica: usize) -> Result<StatusReply, Status> {
        let ch = self.channel_of(replica)?;
        let mut req = Request::new(StatusRequest {});
        req.set_timeout(Duration::from_secs(2));
        Ok(AdminClient::new(ch).status(req).await?.into_inner())
    }

    /// Adds replica `id` (running, started with `--join`) at `addr`; returns the new membership.
    pub async fn add_member(&self, id: u64, addr: &str) -> Result<Vec<Member>, Status> {
        let req = AddMemberRequest {
            id,
            addr: addr.to_string(),
        };
        let reply = self
            .call_parked(req, None, |ch, r| async move {
                AdminClient::new(ch).add_member(r).await
            })
            .await?;
        Ok(reply.members)
    }

    /// Removes replica `id`; returns the new membership.
    ///
    /// A membership change has no request id: when the replica that forwarded the first attempt
    /// is the one removed, it cannot deliver the answer, and the retry finds the replica gone
    /// (NOT_FOUND). So the membership is read first: an unknown id is NOT_FOUND at once, and a
    /// NOT_FOUND from the change itself, for a replica that was a member, means it is removed.
    pub async fn remove_member(&self, id: u64) -> Result<Vec<Member>, Status> {
        let before = self.members().await?;
        if !before.iter().any(|m| m.id == id) {
            let ids: Vec<u64> = before.iter().map(|m| m.id).collect();
            return Err(Status::not_found(format!(
                "replica {id} is not a member (members: {ids:?})"
            )));
        }
        let reply = self
            .call_parked(RemoveMemberRequest { id }, None, |ch, r| async move {
                AdminClient::new(ch).remove_member(r).await
            })
            .await;
        match reply {
            Ok(r) => Ok(r.members),
            Err(e) if e.code() == Code::NotFound => self.members().await,
            Err(e) => Err(e),
        }
    }

    /// Every task's state, incarnation and heartbeat age, from the leader.
    pub async fn tasks(&self) -> Result<TasksReply, Status> {
        self.call(TasksRequest {}, None, |ch, r| async move {
            AdminClient::new(ch).tasks(r).await
        })
        .await
    }

    /// The open barriers, from the leader.
    pub async fn barriers(&self) -> Result<BarriersReply, Status> {
        self.call(BarriersRequest {}, None, |ch, r| async move {
            AdminClient::new(ch).barriers(r).await
        })
        .await
    }

    /// Makes replica `replica` (an index into the endpoints) snapshot now; returns the index the
    /// snapshot covers. No retries: it is that replica's snapshot.
    pub async fn snapshot_of(&self, replica: usize) -> Result<u64, Status> {
        let ch = self.channel_of(replica)?;
        let mut req = Request::new(SnapshotRequest {});
        req.set_timeout(Duration::from_secs(90));
        let reply = AdminClient::new(ch).snapshot(req).await?;
        Ok(reply.into_inner().snapshot_index)
    }

    /// A backup of the whole replicated state from the leader (`coord.admin.Admin/Backup`): what
    /// it holds (the first piece, without data) and the backup file's bytes. A backup cut off (the
    /// leader lost) is taken again from the new one.
    pub async fn backup(&self) -> Result<(BackupChunk, Vec<u8>), Status> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let mut stream = self
                .call_with(
                    BackupRequest {},
                    None,
                    Some(BACKUP_START_TIMEOUT),
                    |ch, r| async move { AdminClient::new(ch).backup(r).await },
                )
                .await?;
            let mut file = Vec::new();
            let mut about = None;
            let cut = loop {
                match stream.message().await {
                    Ok(Some(mut chunk)) => {
                        file.extend_from_slice(&chunk.data);
                        if about.is_none() {
                            chunk.data = Default::default();
                            about = Some(chunk);
                        }
                    }
                    Ok(None) => {
                        return match about {
                            Some(a) if a.total_bytes == file.len() as u64 => Ok((a, file)),
                            _ => Err(Status::data_loss(format!(
                                "the backup stream ended after {} bytes, short of the file",
                                file.len()
                            ))),
                        }
                    }
                    Err(e) => break e,
                }
            };
            if cut.code() != Code::Unavailable || attempts >= 3 {
                return Err(cut);
            }
        }
    }

    /// Hands leadership to voter `to` (or the most up-to-date one); the new leader and how long
    /// the handoff took.
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<TransferLeaderReply, Status> {
        self.call_with(
            TransferLeaderRequest { to },
            None,
            Some(Duration::from_secs(10)),
            |ch, r| async move { AdminClient::new(ch).transfer_leader(r).await },
        )
        .await
    }

    /// The membership, as the leader (or, failing that, any replica) reports it.
    pub async fn members(&self) -> Result<Vec<Member>, Status> {
        let mut any = None;
        for i in 0..self.inner.endpoints.len() {
            if let Ok(s) = self.status_of(i).await {
                if s.state == "Leader" {
                    return Ok(s.members);
                }
                any.get_or_insert(s.members);
            }
        }
        any.ok_or_else(|| Status::unavailable("no replica answered"))
    }

    /// Ends the coordinated job's current run (every task disconnected, its barriers and the keys
    /// it wrote gone); returns the run that began.
    pub async fn end_run(&self, reason: &str) -> Result<u64, Status> {
        let req = coord_proto::coord::admin::EndRunRequest {
            reason: reason.to_string(),
        };
        self.mutate(
            req,
            |ch, r| async move { AdminClient::new(ch).end_run(r).await },
        )
        .await
        .map(|r| r.run)
    }

    /// Ends the coordination service for the job: pending barriers fail ABORTED.
    pub async fn shutdown_service(&self, reason: &str) -> Result<(), Status> {
        let req = ShutdownServiceRequest {
            reason: reason.to_string(),
        };
        self.mutate(req, |ch, r| async move {
            AdminClient::new(ch).shutdown_service(r).await
        })
        .await
        .map(|_| ())
    }
}

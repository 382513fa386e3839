//! `coord.coordination.Coordination`: how agents learn of errors (a long poll, re-driven across
//! leader changes by its sequence number) and read task states.

use std::sync::Arc;

use crate::raft::peers::PeerChannel;
use coord_proto::coord::coordination as pb;
use coord_proto::coord::coordination::coordination_client::CoordinationClient;
use coord_proto::coord::coordination::coordination_server::Coordination;
use tonic::{Request, Response, Status};

use crate::api::wire::{error_payload, state_to, task_from, task_to, tasks_from};
use crate::error::grpc_code;
use crate::serve::coordination::CoordCore;
use crate::serve::route::{Kind, Router};

pub struct CoordService {
    router: Arc<Router>,
    core: Arc<CoordCore>,
}

impl CoordService {
    pub fn new(router: Arc<Router>, core: Arc<CoordCore>) -> Self {
        Self { router, core }
    }
}

fn client(ch: PeerChannel) -> CoordinationClient<PeerChannel> {
    CoordinationClient::new(ch)
}

#[tonic::async_trait]
impl Coordination for CoordService {
    async fn poll_for_error(
        &self,
        req: Request<pb::PollForErrorRequest>,
    ) -> Result<Response<pb::PollForErrorResponse>, Status> {
        self.router.check_task(
            &req,
            "coordination/PollForError",
            "task",
            req.get_ref().task.as_ref(),
        )?;
        let core = &*self.core;
        self.router
            .route(
                "coordination/PollForError",
                Kind::Read,
                req,
                |m, _| async move {
                    let task = task_from(m.task.as_ref(), "task")?;
                    let e = core.poll_error(task, m.after_seq).await?;
                    Ok(pb::PollForErrorResponse {
                        seq: e.seq,
                        error_code: grpc_code(e.error.code) as i32,
                        error_message: format!(
                            "task {} failed: {}",
                            e.error.source, e.error.message
                        ),
                        error_payload: Some(error_payload(&e.error)),
                    })
                },
                |ch, r| async move { client(ch).poll_for_error(r).await },
            )
            .await
    }

    async fn get_task_state(
        &self,
        req: Request<pb::GetTaskStateRequest>,
    ) -> Result<Response<pb::GetTaskStateResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "coordination/GetTaskState",
                Kind::Read,
                req,
                |m, _| async move {
                    let tasks = tasks_from(&m.tasks, "tasks")?;
                    let (service_incarnation, records) = core.task_states(tasks).await?;
                    Ok(pb::GetTaskStateResponse {
                        service_incarnation,
                        tasks: records
                            .into_iter()
                            .map(|(t, r)| pb::TaskStateInfo {
                                task: Some(task_to(&t)),
                                state: state_to(r.state) as i32,
                                incarnation: r.incarnation,
                                error_code: r
                                    .error
                                    .as_ref()
                                    .map_or(0, |e| grpc_code(e.code) as i32),
                                error_message: r
                                    .error
                                    .as_ref()
                                    .map_or_else(String::new, |e| e.message.clone()),
                                error_payload: r.error.as_ref().map(error_payload),
                            })
                            .collect(),
                    })
                },
                |ch, r| async move { client(ch).get_task_state(r).await },
            )
            .await
    }
}

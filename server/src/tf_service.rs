//! The `tensorflow.CoordinationService` wire adapter: decodes TensorFlow's messages, routes each
//! call to the leader and maps the answer back. The semantics live in [`KvCore`].

use std::sync::Arc;

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_proto::tensorflow::coordination_service_server::CoordinationService;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::error::CoordError;
use crate::kv::KvCore;
use crate::peers::PEER_MESSAGE_LIMIT;
use crate::route::{Kind, Router};

pub struct TfService {
    router: Arc<Router>,
    kv: Arc<KvCore>,
}

impl TfService {
    pub fn new(router: Arc<Router>, kv: Arc<KvCore>) -> Self {
        Self { router, kv }
    }
}

fn client(ch: Channel) -> CoordinationServiceClient<Channel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

fn entry(key: String, value: bytes::Bytes) -> tf::KeyValueEntry {
    tf::KeyValueEntry { key, value }
}

/// The task-related RPCs come with the coordination service proper (tasks, heartbeats, errors,
/// barriers); until then they say so instead of pretending.
fn not_yet(method: &str) -> Status {
    Status::unimplemented(format!(
        "{method} is not served by this version of coord: only the key-value RPCs are"
    ))
}

#[tonic::async_trait]
impl CoordinationService for TfService {
    async fn register_task(
        &self,
        _: Request<tf::RegisterTaskRequest>,
    ) -> Result<Response<tf::RegisterTaskResponse>, Status> {
        Err(not_yet("RegisterTask"))
    }

    async fn heartbeat(
        &self,
        _: Request<tf::HeartbeatRequest>,
    ) -> Result<Response<tf::HeartbeatResponse>, Status> {
        Err(not_yet("Heartbeat"))
    }

    async fn wait_for_all_tasks(
        &self,
        _: Request<tf::WaitForAllTasksRequest>,
    ) -> Result<Response<tf::WaitForAllTasksResponse>, Status> {
        Err(not_yet("WaitForAllTasks"))
    }

    async fn shutdown_task(
        &self,
        _: Request<tf::ShutdownTaskRequest>,
    ) -> Result<Response<tf::ShutdownTaskResponse>, Status> {
        Err(not_yet("ShutdownTask"))
    }

    async fn reset_task(
        &self,
        _: Request<tf::ResetTaskRequest>,
    ) -> Result<Response<tf::ResetTaskResponse>, Status> {
        Err(not_yet("ResetTask"))
    }

    async fn report_error_to_task(
        &self,
        _: Request<tf::ReportErrorToTaskRequest>,
    ) -> Result<Response<tf::ReportErrorToTaskResponse>, Status> {
        Err(not_yet("ReportErrorToTask"))
    }

    async fn report_error_to_service(
        &self,
        _: Request<tf::ReportErrorToServiceRequest>,
    ) -> Result<Response<tf::ReportErrorToServiceResponse>, Status> {
        Err(not_yet("ReportErrorToService"))
    }

    async fn insert_key_value(
        &self,
        req: Request<tf::InsertKeyValueRequest>,
    ) -> Result<Response<tf::InsertKeyValueResponse>, Status> {
        let kv = &*self.kv;
        self.router
            .route(
                "InsertKeyValue",
                Kind::Write,
                req,
                |m, id| async move {
                    let e = m.kv.ok_or_else(|| {
                        CoordError::InvalidArgument("InsertKeyValueRequest.kv is missing".into())
                    })?;
                    kv.insert(id, &e.key, e.value, m.allow_overwrite).await?;
                    Ok(tf::InsertKeyValueResponse {})
                },
                |ch, r| async move { client(ch).insert_key_value(r).await },
            )
            .await
    }

    async fn get_key_value(
        &self,
        req: Request<tf::GetKeyValueRequest>,
    ) -> Result<Response<tf::GetKeyValueResponse>, Status> {
        let kv = &*self.kv;
        self.router
            .route(
                "GetKeyValue",
                Kind::Read,
                req,
                |m, _| async move {
                    let (key, value) = kv.get(&m.key).await?;
                    Ok(tf::GetKeyValueResponse {
                        kv: Some(entry(key, value)),
                    })
                },
                |ch, r| async move { client(ch).get_key_value(r).await },
            )
            .await
    }

    async fn try_get_key_value(
        &self,
        req: Request<tf::TryGetKeyValueRequest>,
    ) -> Result<Response<tf::TryGetKeyValueResponse>, Status> {
        let kv = &*self.kv;
        self.router
            .route(
                "TryGetKeyValue",
                Kind::Read,
                req,
                |m, _| async move {
                    let (key, value) = kv.try_get(&m.key).await?;
                    Ok(tf::TryGetKeyValueResponse {
                        kv: Some(entry(key, value)),
                    })
                },
                |ch, r| async move { client(ch).try_get_key_value(r).await },
            )
            .await
    }

    async fn get_key_value_dir(
        &self,
        req: Request<tf::GetKeyValueDirRequest>,
    ) -> Result<Response<tf::GetKeyValueDirResponse>, Status> {
        let kv = &*self.kv;
        self.router
            .route(
                "GetKeyValueDir",
                Kind::Read,
                req,
                |m, _| async move {
                    let (dir, entries) = kv.get_dir(&m.directory_key).await?;
                    Ok(tf::GetKeyValueDirResponse {
                        directory_key: dir,
                        kv: entries.into_iter().map(|(k, v)| entry(k, v)).collect(),
                    })
                },
                |ch, r| async move { client(ch).get_key_value_dir(r).await },
            )
            .await
    }

    async fn delete_key_value(
        &self,
        req: Request<tf::DeleteKeyValueRequest>,
    ) -> Result<Response<tf::DeleteKeyValueResponse>, Status> {
        let kv = &*self.kv;
        self.router
            .route(
                "DeleteKeyValue",
                Kind::Write,
                req,
                // The key and everything under it go, whatever `is_directory` says (as TensorFlow
                // does since it made the flag obsolete).
                |m, id| async move {
                    kv.delete(id, &m.key).await?;
                    Ok(tf::DeleteKeyValueResponse {})
                },
                |ch, r| async move { client(ch).delete_key_value(r).await },
            )
            .await
    }

    async fn barrier(
        &self,
        _: Request<tf::BarrierRequest>,
    ) -> Result<Response<tf::BarrierResponse>, Status> {
        Err(not_yet("Barrier"))
    }

    async fn cancel_barrier(
        &self,
        _: Request<tf::CancelBarrierRequest>,
    ) -> Result<Response<tf::CancelBarrierResponse>, Status> {
        Err(not_yet("CancelBarrier"))
    }
}

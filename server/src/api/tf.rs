//! The `tensorflow.CoordinationService` wire adapter: decodes TensorFlow's messages, routes each
//! call to the leader and maps the answer back. The semantics live in [`KvCore`] and
//! [`CoordCore`].

use std::sync::{Arc, Mutex, PoisonError};

use coord_raft_store::state::DeviceInfo;

use crate::raft::peers::PeerChannel;
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_proto::tensorflow::coordination_service_server::CoordinationService;
use tonic::{Request, Response, Status};

use crate::api::wire::{cluster_devices, devices_from, task_from, tasks_from};
use crate::error::CoordError;
use crate::raft::peers::PEER_MESSAGE_LIMIT;
use crate::serve::coordination::CoordCore;
use crate::serve::kv::KvCore;
use crate::serve::route::{Kind, Router};

pub struct TfService {
    router: Arc<Router>,
    kv: Arc<KvCore>,
    coord: Arc<CoordCore>,
    /// The last cluster device info built for WaitForAllTasks, per device list and kind: a whole
    /// job released at once gets one copy built, not one per task.
    devices: Mutex<Option<DevicesReply>>,
}

struct DevicesReply {
    from: Arc<Vec<DeviceInfo>>,
    xla: bool,
    reply: tf::CoordinationServiceDeviceInfo,
}

impl TfService {
    pub fn new(router: Arc<Router>, kv: Arc<KvCore>, coord: Arc<CoordCore>) -> Self {
        Self {
            router,
            kv,
            coord,
            devices: Mutex::new(None),
        }
    }

    fn cluster_devices(
        &self,
        mine: &DeviceInfo,
        all: &Arc<Vec<DeviceInfo>>,
    ) -> tf::CoordinationServiceDeviceInfo {
        let xla = matches!(mine, DeviceInfo::Xla(_));
        let mut cache = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = cache
            .as_ref()
            .filter(|c| Arc::ptr_eq(&c.from, all) && c.xla == xla)
        {
            return c.reply.clone();
        }
        let reply = cluster_devices(mine, all);
        *cache = Some(DevicesReply {
            from: all.clone(),
            xla,
            reply: reply.clone(),
        });
        reply
    }
}

fn client(ch: PeerChannel) -> CoordinationServiceClient<PeerChannel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

fn entry(key: String, value: bytes::Bytes) -> tf::KeyValueEntry {
    tf::KeyValueEntry { key, value }
}

#[tonic::async_trait]
impl CoordinationService for TfService {
    async fn register_task(
        &self,
        req: Request<tf::RegisterTaskRequest>,
    ) -> Result<Response<tf::RegisterTaskResponse>, Status> {
        self.router.check_task(
            &req,
            "RegisterTask",
            "source_task",
            req.get_ref().source_task.as_ref(),
        )?;
        let core = &*self.coord;
        self.router
            .route(
                "RegisterTask",
                Kind::Write,
                req,
                |m, id| async move {
                    let task = task_from(m.source_task.as_ref(), "source_task")?;
                    let leader_incarnation = core.register(id, task, m.incarnation).await?;
                    Ok(tf::RegisterTaskResponse { leader_incarnation })
                },
                |ch, r| async move { client(ch).register_task(r).await },
            )
            .await
    }

    async fn heartbeat(
        &self,
        req: Request<tf::HeartbeatRequest>,
    ) -> Result<Response<tf::HeartbeatResponse>, Status> {
        self.router.check_task(
            &req,
            "Heartbeat",
            "source_task",
            req.get_ref().source_task.as_ref(),
        )?;
        let core = &*self.coord;
        self.router
            .route(
                "Heartbeat",
                Kind::Read,
                req,
                |m, _| async move {
                    let task = task_from(m.source_task.as_ref(), "source_task")?;
                    let leader_incarnation = core.heartbeat(&task, m.incarnation)?;
                    Ok(tf::HeartbeatResponse { leader_incarnation })
                },
                |ch, r| async move { client(ch).heartbeat(r).await },
            )
            .await
    }

    async fn wait_for_all_tasks(
        &self,
        req: Request<tf::WaitForAllTasksRequest>,
    ) -> Result<Response<tf::WaitForAllTasksResponse>, Status> {
        self.router.check_task(
            &req,
            "WaitForAllTasks",
            "source_task",
            req.get_ref().source_task.as_ref(),
        )?;
        let core = &*self.coord;
        let this = self;
        self.router
            .route(
                "WaitForAllTasks",
                Kind::Write,
                req,
                |m, id| async move {
                    let task = task_from(m.source_task.as_ref(), "source_task")?;
                    let mine = devices_from(m.local_device_info.as_ref());
                    let (leader_incarnation, all) =
                        core.wait_for_all(id, task, mine.clone()).await?;
                    Ok(tf::WaitForAllTasksResponse {
                        leader_incarnation,
                        cluster_device_info: Some(this.cluster_devices(&mine, &all)),
                    })
                },
                |ch, r| async move { client(ch).wait_for_all_tasks(r).await },
            )
            .await
    }

    async fn shutdown_task(
        &self,
        req: Request<tf::ShutdownTaskRequest>,
    ) -> Result<Response<tf::ShutdownTaskResponse>, Status> {
        self.router.check_task(
            &req,
            "ShutdownTask",
            "source_task",
            req.get_ref().source_task.as_ref(),
        )?;
        let core = &*self.coord;
        self.router
            .route(
                "ShutdownTask",
                Kind::Write,
                req,
                // A task at the shutdown barrier is disconnected whatever the barrier's outcome
                // (the tasks that did not reach it are the ones put in error).
                |m, id| async move {
                    let task = task_from(m.source_task.as_ref(), "source_task")?;
                    core.shutdown(id, task).await?;
                    Ok(tf::ShutdownTaskResponse {})
                },
                |ch, r| async move { client(ch).shutdown_task(r).await },
            )
            .await
    }

    async fn reset_task(
        &self,
        req: Request<tf::ResetTaskRequest>,
    ) -> Result<Response<tf::ResetTaskResponse>, Status> {
        self.router.check_task(
            &req,
            "ResetTask",
            "source_task",
            req.get_ref().source_task.as_ref(),
        )?;
        let core = &*self.coord;
        self.router
            .route(
                "ResetTask",
                Kind::Write,
                req,
                |m, id| async move {
                    let task = task_from(m.source_task.as_ref(), "source_task")?;
                    core.reset(id, task).await?;
                    Ok(tf::ResetTaskResponse {})
                },
                |ch, r| async move { client(ch).reset_task(r).await },
            )
            .await
    }

    /// Served by agents, not by the coordinator: the service does not call agents; they learn of
    /// errors by polling `coord.coordination.Coordination/PollForError`.
    async fn report_error_to_task(
        &self,
        _: Request<tf::ReportErrorToTaskRequest>,
    ) -> Result<Response<tf::ReportErrorToTaskResponse>, Status> {
        Err(Status::unimplemented(
            "ReportErrorToTask is an agent's RPC; coord delivers errors through coord.coordination.Coordination/PollForError",
        ))
    }

    async fn report_error_to_service(
        &self,
        req: Request<tf::ReportErrorToServiceRequest>,
    ) -> Result<Response<tf::ReportErrorToServiceResponse>, Status> {
        self.router.check_task(
            &req,
            "ReportErrorToService",
            "error_origin",
            req.get_ref().error_origin.as_ref(),
        )?;
        let core = &*self.coord;
        self.router
            .route(
                "ReportErrorToService",
                Kind::Write,
                req,
                |m, id| async move {
                    let task = task_from(m.error_origin.as_ref(), "error_origin")?;
                    core.report_error(id, task, m.error_code, m.error_message)
                        .await?;
                    Ok(tf::ReportErrorToServiceResponse {})
                },
                |ch, r| async move { client(ch).report_error_to_service(r).await },
            )
            .await
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
        req: Request<tf::BarrierRequest>,
    ) -> Result<Response<tf::BarrierResponse>, Status> {
        self.router.check_task(
            &req,
            "Barrier",
            "source_task",
            req.get_ref().source_task.as_ref(),
        )?;
        let core = &*self.coord;
        self.router
            .route(
                "Barrier",
                Kind::Write,
                req,
                |m, id| async move {
                    let source = task_from(m.source_task.as_ref(), "source_task")?;
                    let tasks = tasks_from(&m.tasks, "tasks")?;
                    let counter = core
                        .barrier(
                            id,
                            m.barrier_id,
                            m.counter,
                            tasks,
                            m.barrier_timeout_in_ms,
                            source,
                        )
                        .await?;
                    Ok(tf::BarrierResponse { counter })
                },
                |ch, r| async move { client(ch).barrier(r).await },
            )
            .await
    }

    async fn cancel_barrier(
        &self,
        req: Request<tf::CancelBarrierRequest>,
    ) -> Result<Response<tf::CancelBarrierResponse>, Status> {
        self.router.check_task(
            &req,
            "CancelBarrier",
            "source_task",
            req.get_ref().source_task.as_ref(),
        )?;
        let core = &*self.coord;
        self.router
            .route(
                "CancelBarrier",
                Kind::Write,
                req,
                |m, id| async move {
                    let source = task_from(m.source_task.as_ref(), "source_task")?;
                    core.cancel_barrier(id, m.barrier_id, m.counter, source)
                        .await?;
                    Ok(tf::CancelBarrierResponse {})
                },
                |ch, r| async move { client(ch).cancel_barrier(r).await },
            )
            .await
    }
}

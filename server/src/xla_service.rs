//! The `xla.coordination.CoordinationService` wire adapter: what jaxlib 0.10+ speaks. Like
//! [`crate::tf_service`], it only decodes, routes to the leader and encodes; the semantics are
//! [`KvCore`]'s and [`CoordCore`]'s, shared with the TensorFlow surface.
//!
//! What XLA adds on the wire:
//! - tasks are integer ids, all of one configured job (`--xla-job`);
//! - every request but RegisterTask carries the service incarnation, and a stale one is refused
//!   (INTERNAL with a `ServiceMismatchError`), so a client never talks to a service that lost its
//!   state. Ours is the cluster's, fixed when the ensemble set the cluster up, so failover never
//!   trips it;
//! - every error the service itself produces carries a `CoordinationServiceError` in
//!   `grpc-status-details-bin` (barrier errors a `BarrierError` too): jaxlib takes an error
//!   without one for a broken connection. Routing's UNAVAILABLE ("try another replica") is sent
//!   without, on purpose (see [`crate::xla_errors`]);
//! - RegisterTask waits at a register barrier of every task (as JAX configures its service).

use std::sync::Arc;

use crate::peers::PeerChannel;
use bytes::Bytes;
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient;
use coord_proto::xla::coordination::coordination_service_server::CoordinationService;
use coord_raft_store::state::{Cluster, Outcome, TaskName, TaskState};
use tonic::{Request, Response, Status};

use crate::coordination::CoordCore;
use crate::error::{grpc_code, CoordError};
use crate::kv::KvCore;
use crate::peers::PEER_MESSAGE_LIMIT;
use crate::route::{Kind, Router};
use crate::xla_errors::{barrier_error, detailed, error_payload, id_of, polled, service_mismatch};

pub struct XlaService {
    router: Arc<Router>,
    kv: Arc<KvCore>,
    coord: Arc<CoordCore>,
    /// `--xla-job`; `None` = the first job of the replicated cluster configuration.
    job: Option<String>,
}

fn client(ch: PeerChannel) -> CoordinationServiceClient<PeerChannel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

fn entry(key: String, value: Bytes) -> xla::KeyValueEntry {
    xla::KeyValueEntry { key, value }
}

/// `Incarnations` as a request carries it: the service incarnation it believes in.
fn claimed_incarnation(i: Option<&xla::Incarnations>) -> u64 {
    i.map_or(0, |i| i.service_incarnation)
}

fn state_of(s: TaskState) -> xla::TaskState {
    match s {
        TaskState::Disconnected => xla::TaskState::TaskstateDisconnected,
        TaskState::Connected => xla::TaskState::TaskstateConnected,
        TaskState::Error => xla::TaskState::TaskstateError,
    }
}

impl XlaService {
    pub fn new(
        router: Arc<Router>,
        kv: Arc<KvCore>,
        coord: Arc<CoordCore>,
        job: Option<String>,
    ) -> Self {
        Self {
            router,
            kv,
            coord,
            job,
        }
    }

    /// The XLA job's name and task count, from the replicated configuration.
    fn job(&self) -> Result<(String, u32), CoordError> {
        let found = self.coord.reader.read(|a| {
            let c: &Cluster = a.state.cluster.as_ref()?;
            let (name, n) = match &self.job {
                Some(j) => (j.clone(), c.config.jobs.get(j).copied()),
                None => c
                    .config
                    .jobs
                    .iter()
                    .next()
                    .map(|(j, n)| (j.clone(), Some(*n)))?,
            };
            Some((name, n))
        });
        match found {
            None => Err(CoordError::Unavailable(
                "the coordination service has no cluster configuration yet".into(),
            )),
            Some((name, None)) => Err(detailed(CoordError::Internal(format!(
                "--xla-job {name:?} is not a job of the cluster; XLA task ids cannot be served"
            )))),
            Some((name, Some(n))) => Ok((name, n)),
        }
    }

    /// The task XLA's id `id` names (in `field`), checked against the job's size.
    fn task(&self, id: i32, field: &str) -> Result<TaskName, CoordError> {
        let (job, n) = self.job()?;
        task_of(&job, n, id, field)
    }

    /// Over TLS, a task's certificate acts only as its own task (see `authz`): `id` is the XLA
    /// task id the request names in `field`.
    fn acting_as<T>(
        &self,
        req: &Request<T>,
        method: &'static str,
        field: &str,
        id: i32,
    ) -> Result<(), Status> {
        let check = self.router.authz().acting_as_with(req, method, field, || {
            let (job, _) = self.job().map_err(Status::from)?;
            Ok((job, i64::from(id)))
        });
        self.router.checked(method, check)
    }

    /// Every task of `ids` (the job read once for all of them).
    fn tasks(&self, ids: &[i32], field: &str) -> Result<Vec<TaskName>, CoordError> {
        let (job, n) = self.job()?;
        ids.iter().map(|&i| task_of(&job, n, i, field)).collect()
    }

    fn all_tasks(&self) -> Result<Vec<TaskName>, CoordError> {
        let (job, n) = self.job()?;
        Ok((0..n).map(|t| TaskName::new(job.clone(), t)).collect())
    }

    /// Refuses a request made for another service incarnation (another service, or one that
    /// lost its state): the client must not carry on against it.
    fn check_incarnation(&self, i: Option<&xla::Incarnations>) -> Result<(), CoordError> {
        let ours = self.coord.service_incarnation()?;
        let theirs = claimed_incarnation(i);
        if theirs == ours {
            return Ok(());
        }
        Err(service_mismatch(theirs, ours))
    }
}

/// Task `id` of `job` (which has `n` tasks), or INVALID_ARGUMENT naming it.
fn task_of(job: &str, n: u32, id: i32, field: &str) -> Result<TaskName, CoordError> {
    match u32::try_from(id) {
        Ok(t) if t < n => Ok(TaskName::new(job, t)),
        _ => Err(detailed(CoordError::InvalidArgument(format!(
            "{field}: task {id} is not a task of job {job:?} (tasks 0..{})",
            n.saturating_sub(1)
        )))),
    }
}

/// Runs `f`, giving its service errors their XLA payload.
async fn served<T>(
    f: impl std::future::Future<Output = Result<T, CoordError>>,
) -> Result<T, CoordError> {
    f.await.map_err(detailed)
}

#[tonic::async_trait]
impl CoordinationService for XlaService {
    async fn register_task(
        &self,
        req: Request<xla::RegisterTaskRequest>,
    ) -> Result<Response<xla::RegisterTaskResponse>, Status> {
        self.acting_as(
            &req,
            "xla/RegisterTask",
            "source_task_id",
            req.get_ref().source_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/RegisterTask",
                Kind::Write,
                req,
                |m, id| {
                    served(async move {
                        let task = this.task(m.source_task_id, "source_task_id")?;
                        let all = this.all_tasks()?;
                        let service_incarnation = this
                            .coord
                            .register_at_barrier(id, task, m.incarnation, all)
                            .await?;
                        Ok(xla::RegisterTaskResponse {
                            service_incarnation,
                        })
                    })
                },
                |ch, r| async move { client(ch).register_task(r).await },
            )
            .await
    }

    async fn heartbeat(
        &self,
        req: Request<xla::HeartbeatRequest>,
    ) -> Result<Response<xla::HeartbeatResponse>, Status> {
        self.acting_as(
            &req,
            "xla/Heartbeat",
            "source_task_id",
            req.get_ref().source_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/Heartbeat",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let task = this.task(m.source_task_id, "source_task_id")?;
                        let incarnation = match m.incarnations.as_ref() {
                            Some(i) if i.task_incarnation != 0 => i.task_incarnation,
                            _ => m.incarnation,
                        };
                        let service_incarnation = this.coord.heartbeat(&task, incarnation)?;
                        Ok(xla::HeartbeatResponse {
                            service_incarnation,
                        })
                    })
                },
                |ch, r| async move { client(ch).heartbeat(r).await },
            )
            .await
    }

    async fn shutdown_task(
        &self,
        req: Request<xla::ShutdownTaskRequest>,
    ) -> Result<Response<xla::ShutdownTaskResponse>, Status> {
        self.acting_as(
            &req,
            "xla/ShutdownTask",
            "source_task_id",
            req.get_ref().source_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/ShutdownTask",
                Kind::Write,
                req,
                |m, id| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let task = this.task(m.source_task_id, "source_task_id")?;
                        match this.coord.shutdown(id, task).await? {
                            Some(Outcome::Failed { code, message }) => {
                                Err(CoordError::status(code, message))
                            }
                            _ => Ok(xla::ShutdownTaskResponse {}),
                        }
                    })
                },
                |ch, r| async move { client(ch).shutdown_task(r).await },
            )
            .await
    }

    async fn watch_tasks(
        &self,
        req: Request<xla::WatchTasksRequest>,
    ) -> Result<Response<xla::WatchTasksResponse>, Status> {
        let this = self;
        self.router
            .route(
                "xla/WatchTasks",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let tasks = this.all_tasks()?;
                        let (version_number, records) =
                            this.coord.watch_tasks(&tasks, m.version_number).await?;
                        let task_state = records
                            .into_iter()
                            .map(|(t, r)| xla::TaskInfo {
                                task_id: id_of(&t),
                                incarnation: r.incarnation,
                                state: state_of(r.state) as i32,
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
                            .collect();
                        Ok(xla::WatchTasksResponse {
                            task_state,
                            version_number,
                        })
                    })
                },
                |ch, r| async move { client(ch).watch_tasks(r).await },
            )
            .await
    }

    async fn insert_key_value(
        &self,
        req: Request<xla::InsertKeyValueRequest>,
    ) -> Result<Response<xla::InsertKeyValueResponse>, Status> {
        let this = self;
        self.router
            .route(
                "xla/InsertKeyValue",
                Kind::Write,
                req,
                |m, id| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let e = m.kv.ok_or_else(|| {
                            CoordError::InvalidArgument(
                                "InsertKeyValueRequest.kv is missing".into(),
                            )
                        })?;
                        this.kv
                            .insert(id, &e.key, e.value, m.allow_overwrite)
                            .await?;
                        Ok(xla::InsertKeyValueResponse {})
                    })
                },
                |ch, r| async move { client(ch).insert_key_value(r).await },
            )
            .await
    }

    async fn get_key_value(
        &self,
        req: Request<xla::GetKeyValueRequest>,
    ) -> Result<Response<xla::GetKeyValueResponse>, Status> {
        let this = self;
        self.router
            .route(
                "xla/GetKeyValue",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let (key, value) = this.kv.get(&m.key).await?;
                        Ok(xla::GetKeyValueResponse {
                            kv: Some(entry(key, value)),
                        })
                    })
                },
                |ch, r| async move { client(ch).get_key_value(r).await },
            )
            .await
    }

    async fn try_get_key_value(
        &self,
        req: Request<xla::TryGetKeyValueRequest>,
    ) -> Result<Response<xla::TryGetKeyValueResponse>, Status> {
        let this = self;
        self.router
            .route(
                "xla/TryGetKeyValue",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let (key, value) = this.kv.try_get(&m.key).await?;
                        Ok(xla::TryGetKeyValueResponse {
                            kv: Some(entry(key, value)),
                        })
                    })
                },
                |ch, r| async move { client(ch).try_get_key_value(r).await },
            )
            .await
    }

    async fn increment_key_value(
        &self,
        req: Request<xla::IncrementKeyValueRequest>,
    ) -> Result<Response<xla::IncrementKeyValueResponse>, Status> {
        let this = self;
        self.router
            .route(
                "xla/IncrementKeyValue",
                Kind::Write,
                req,
                |m, id| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let key = this.kv.check_key(&m.key, "key")?;
                        let value = this.kv.increment(id, &key, m.increment).await?;
                        Ok(xla::IncrementKeyValueResponse {
                            kv: Some(entry(key, value)),
                        })
                    })
                },
                |ch, r| async move { client(ch).increment_key_value(r).await },
            )
            .await
    }

    async fn get_key_value_dir(
        &self,
        req: Request<xla::GetKeyValueDirRequest>,
    ) -> Result<Response<xla::GetKeyValueDirResponse>, Status> {
        let this = self;
        self.router
            .route(
                "xla/GetKeyValueDir",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let (dir, entries) = this.kv.get_dir(&m.directory_key).await?;
                        Ok(xla::GetKeyValueDirResponse {
                            directory_key: dir,
                            kv: entries.into_iter().map(|(k, v)| entry(k, v)).collect(),
                        })
                    })
                },
                |ch, r| async move { client(ch).get_key_value_dir(r).await },
            )
            .await
    }

    async fn delete_key_value(
        &self,
        req: Request<xla::DeleteKeyValueRequest>,
    ) -> Result<Response<xla::DeleteKeyValueResponse>, Status> {
        let this = self;
        self.router
            .route(
                "xla/DeleteKeyValue",
                Kind::Write,
                req,
                // The key and everything under it, whatever `is_directory` says (as XLA does).
                |m, id| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        this.kv.delete(id, &m.key).await?;
                        Ok(xla::DeleteKeyValueResponse {})
                    })
                },
                |ch, r| async move { client(ch).delete_key_value(r).await },
            )
            .await
    }

    async fn barrier(
        &self,
        req: Request<xla::BarrierRequest>,
    ) -> Result<Response<xla::BarrierResponse>, Status> {
        self.acting_as(
            &req,
            "xla/Barrier",
            "source_task_id",
            req.get_ref().source_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/Barrier",
                Kind::Write,
                req,
                |m, id| async move {
                    let (barrier_id, counter) = (m.barrier_id.clone(), m.counter);
                    let passed = async {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let source = this.task(m.source_task_id, "source_task_id")?;
                        let tasks = this.tasks(&m.task_ids, "task_ids")?;
                        this.coord
                            .barrier(
                                id,
                                m.barrier_id,
                                m.counter,
                                tasks,
                                m.barrier_timeout_in_ms,
                                source,
                            )
                            .await
                    };
                    match passed.await {
                        Ok(counter) => Ok(xla::BarrierResponse { counter }),
                        Err(e) => Err(barrier_error(e, &barrier_id, counter)),
                    }
                },
                |ch, r| async move { client(ch).barrier(r).await },
            )
            .await
    }

    async fn cancel_barrier(
        &self,
        req: Request<xla::CancelBarrierRequest>,
    ) -> Result<Response<xla::CancelBarrierResponse>, Status> {
        self.acting_as(
            &req,
            "xla/CancelBarrier",
            "source_task_id",
            req.get_ref().source_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/CancelBarrier",
                Kind::Write,
                req,
                |m, id| async move {
                    let (barrier_id, counter) = (m.barrier_id.clone(), m.counter);
                    let cancelled = async {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let source = this.task(m.source_task_id, "source_task_id")?;
                        this.coord
                            .cancel_barrier(id, m.barrier_id, m.counter, source)
                            .await
                    };
                    match cancelled.await {
                        Ok(()) => Ok(xla::CancelBarrierResponse {}),
                        Err(e) => Err(barrier_error(e, &barrier_id, counter)),
                    }
                },
                |ch, r| async move { client(ch).cancel_barrier(r).await },
            )
            .await
    }

    async fn get_alive_tasks(
        &self,
        req: Request<xla::GetAliveTasksRequest>,
    ) -> Result<Response<xla::GetAliveTasksResponse>, Status> {
        self.acting_as(
            &req,
            "xla/GetAliveTasks",
            "requesting_task_id",
            req.get_ref().requesting_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/GetAliveTasks",
                Kind::Write,
                req,
                |m, id| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let source = this.task(m.requesting_task_id, "requesting_task_id")?;
                        let tasks = this.tasks(&m.task_ids, "task_ids")?;
                        let alive = this.coord.get_alive(id, source, tasks).await?;
                        Ok(xla::GetAliveTasksResponse {
                            alive_task_ids: alive.iter().map(|(t, _)| id_of(t)).collect(),
                            incarnations: alive.iter().map(|(_, i)| *i).collect(),
                        })
                    })
                },
                |ch, r| async move { client(ch).get_alive_tasks(r).await },
            )
            .await
    }

    async fn poll_for_error(
        &self,
        req: Request<xla::PollForErrorRequest>,
    ) -> Result<Response<xla::PollForErrorResponse>, Status> {
        self.acting_as(
            &req,
            "xla/PollForError",
            "source_task_id",
            req.get_ref().source_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/PollForError",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let task = this.task(m.source_task_id, "source_task_id")?;
                        let e = this.coord.poll_error_since_register(task).await?;
                        // The error is the answer: the poll ends with it.
                        Err::<xla::PollForErrorResponse, _>(polled(&e))
                    })
                },
                |ch, r| async move { client(ch).poll_for_error(r).await },
            )
            .await
    }

    async fn report_error_to_service(
        &self,
        req: Request<xla::ReportErrorToServiceRequest>,
    ) -> Result<Response<xla::ReportErrorToServiceResponse>, Status> {
        self.acting_as(
            &req,
            "xla/ReportErrorToService",
            "source_task_id",
            req.get_ref().source_task_id,
        )?;
        let this = self;
        self.router
            .route(
                "xla/ReportErrorToService",
                Kind::Write,
                req,
                |m, id| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let task = this.task(m.source_task_id, "source_task_id")?;
                        this.coord
                            .report_error(id, task, m.error_code, m.error_message)
                            .await?;
                        Ok(xla::ReportErrorToServiceResponse {})
                    })
                },
                |ch, r| async move { client(ch).report_error_to_service(r).await },
            )
            .await
    }
}

//! The RPCs of `tensorflow.CoordinationService` (see the [module above](super)).

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_server::CoordinationService;
use coord_raft_store::state::{Outcome, TaskSet};
use futures::future::Either;
use futures::FutureExt;
use std::future::Future;
use tonic::{Request, Response, Status};

use super::waits::Answer;
use super::{client, entry, heartbeat_answer, propagated, refused_registration, served, TfService};
use crate::api::deferred;
use crate::api::payloads::barrier_error;
use crate::api::wire::{state_to, task_from, task_to, tasks_from};
use crate::error::{grpc_code, CoordError};
use crate::serve::route::Kind;

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
                |m, id| {
                    served(async move {
                        let task = task_from(m.source_task.as_ref(), "source_task")?;
                        let recoverable = m.source_task.as_ref().is_some_and(|t| t.recoverable);
                        let leader_incarnation = core
                            .register(id, task.clone(), m.incarnation, recoverable)
                            .await
                            .map_err(|e| refused_registration(e, &task))?;
                        Ok(tf::RegisterTaskResponse { leader_incarnation })
                    })
                },
                |ch, r| async move { client(ch).register_task(r).await },
            )
            .await
    }

    /// Answered from the leader's memory. A task that another task's failure concerns gets that
    /// failure as the answer (see the module doc).
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
                |m, _| {
                    served(async move {
                        let task = task_from(m.source_task.as_ref(), "source_task")?;
                        let leader_incarnation = heartbeat_answer(core, &task, m.incarnation)?;
                        Ok(tf::HeartbeatResponse { leader_incarnation })
                    })
                },
                |ch, r| async move { client(ch).heartbeat(r).await },
            )
            .await
    }

    /// Not an `async fn` (see [`super::waits`]).
    fn wait_for_all_tasks<'life0, 'async_trait>(
        &'life0 self,
        req: Request<tf::WaitForAllTasksRequest>,
    ) -> Answer<'async_trait, tf::WaitForAllTasksResponse>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.wait_for_all_call(req)
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
                // (the tasks that did not reach it are the ones put in error); a failed barrier
                // is its answer.
                |m, id| {
                    served(async move {
                        let task = task_from(m.source_task.as_ref(), "source_task")?;
                        match core.shutdown(id, task).await? {
                            // TF answers INTERNAL, whatever failed the barrier.
                            Some(Outcome::Failed { code, message }) => Err(CoordError::status(
                                coord_raft_store::state::Code::Internal,
                                format!(
                                    "Shutdown barrier has failed.\nBarrier result: '{:?}: {message}'",
                                    grpc_code(code)
                                ),
                            )),
                            _ => Ok(tf::ShutdownTaskResponse {}),
                        }
                    })
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
                |m, id| {
                    served(async move {
                        let task = task_from(m.source_task.as_ref(), "source_task")?;
                        core.reset(id, task).await?;
                        Ok(tf::ResetTaskResponse {})
                    })
                },
                |ch, r| async move { client(ch).reset_task(r).await },
            )
            .await
    }

    /// An agent's RPC (TF's service calls it on each task's own server); the service itself hosts
    /// no agent, and answers as TensorFlow's server does in that case.
    async fn report_error_to_task(
        &self,
        _: Request<tf::ReportErrorToTaskRequest>,
    ) -> Result<Response<tf::ReportErrorToTaskResponse>, Status> {
        Err(crate::api::payloads::detailed_with(
            CoordError::Internal(
                "CoordinationServiceAgent is uninitialized or has already shutdown. (ReportErrorToTask is an agent's RPC; a coord replica hosts no agent)".into(),
            ),
            None,
        )
        .into())
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
                |m, id| {
                    served(async move {
                        let task = task_from(m.error_origin.as_ref(), "error_origin")?;
                        core.report_error(id, task, m.error_code, m.error_message)
                            .await?;
                        Ok(tf::ReportErrorToServiceResponse {})
                    })
                },
                |ch, r| async move { client(ch).report_error_to_service(r).await },
            )
            .await
    }

    async fn get_task_state(
        &self,
        req: Request<tf::GetTaskStateRequest>,
    ) -> Result<Response<tf::GetTaskStateResponse>, Status> {
        let core = &*self.coord;
        self.router
            .route(
                "GetTaskState",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        let tasks = tasks_from(&m.source_task, "source_task")?;
                        if tasks.is_empty() {
                            return Ok(tf::GetTaskStateResponse::default());
                        }
                        let (_, records) = core.task_states(tasks).await?;
                        let task_state = records
                            .into_iter()
                            .zip(&m.source_task)
                            .map(|((t, r), asked)| task_state_info(&t, &r, Some(asked)))
                            .collect();
                        Ok(tf::GetTaskStateResponse { task_state })
                    })
                },
                |ch, r| async move { client(ch).get_task_state(r).await },
            )
            .await
    }

    async fn watch_job_state(
        &self,
        req: Request<tf::WatchJobStateRequest>,
    ) -> Result<Response<tf::WatchJobStateResponse>, Status> {
        let core = &*self.coord;
        self.router
            .route(
                "WatchJobState",
                Kind::Read,
                req,
                |m, _| {
                    served(async move {
                        // TF counts a negative version as none: the state at once.
                        let version = m.version_number.max(-1);
                        let tasks = core.watch_tasks(&m.job_name, version).await?;
                        Ok(tf::WatchJobStateResponse {
                            task_state: tasks
                                .records
                                .iter()
                                .map(|(t, r)| task_state_info(t, r, None))
                                .collect(),
                            version_number: tasks.version,
                        })
                    })
                },
                |ch, r| async move { client(ch).watch_job_state(r).await },
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
        // It may wait: answered after its headers (see `api::deferred`).
        let (this, req) = (self.owned()?, deferred::Held::new(req));
        Ok(deferred::defer(async move {
            this.get_key_value_routed(req.take()).await
        }))
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
                |m, _| {
                    served(async move {
                        let (_, value) = kv.try_get(&m.key).await?;
                        Ok(tf::TryGetKeyValueResponse {
                            kv: Some(entry(m.key, value)),
                        })
                    })
                },
                |ch, r| async move { client(ch).try_get_key_value(r).await },
            )
            .await
            .map(|a| self.values.attach("TryGetKeyValue", a))
    }

    async fn increment_key_value(
        &self,
        req: Request<tf::IncrementKeyValueRequest>,
    ) -> Result<Response<tf::IncrementKeyValueResponse>, Status> {
        let kv = &*self.kv;
        self.router
            .route(
                "IncrementKeyValue",
                Kind::Write,
                req,
                |m, id| {
                    served(async move {
                        let key = kv.check_key(&m.key, "key")?;
                        let value = kv.increment(id, &key, m.increment).await?;
                        Ok(tf::IncrementKeyValueResponse {
                            kv: Some(entry(m.key, value)),
                        })
                    })
                },
                |ch, r| async move { client(ch).increment_key_value(r).await },
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
                    let (_, entries) = kv.get_dir(&m.directory_key).await?;
                    Ok(tf::GetKeyValueDirResponse {
                        // TensorFlow's service leaves it unset.
                        directory_key: String::new(),
                        kv: entries.into_iter().map(|(k, v)| entry(k, v)).collect(),
                    })
                },
                |ch, r| async move { client(ch).get_key_value_dir(r).await },
            )
            .await
            .map(|a| self.values.attach("GetKeyValueDir", a))
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

    /// Not an `async fn` (see [`super::waits`]).
    fn barrier<'life0, 'async_trait>(
        &'life0 self,
        req: Request<tf::BarrierRequest>,
    ) -> Answer<'async_trait, tf::BarrierResponse>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        self.barrier_call(req)
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
                    let (barrier_id, counter) = (m.barrier_id.clone(), m.counter);
                    let cancelled = async {
                        let source = task_from(m.source_task.as_ref(), "source_task")?;
                        core.cancel_barrier(id, m.barrier_id, m.counter, source)
                            .await
                    };
                    match cancelled.await {
                        Ok(()) => Ok(tf::CancelBarrierResponse {}),
                        Err(e) => Err(barrier_error(e, &barrier_id, counter)),
                    }
                },
                |ch, r| async move { client(ch).cancel_barrier(r).await },
            )
            .await
    }

    async fn get_alive_tasks(
        &self,
        req: Request<tf::GetAliveTasksRequest>,
    ) -> Result<Response<tf::GetAliveTasksResponse>, Status> {
        // It may wait: answered after its headers (see `api::deferred`).
        let (this, req) = (self.owned()?, deferred::Held::new(req));
        Ok(deferred::defer(async move {
            this.get_alive_tasks_routed(req.take()).await
        }))
    }

    async fn poll_for_error(
        &self,
        req: Request<tf::PollForErrorRequest>,
    ) -> Result<Response<tf::PollForErrorResponse>, Status> {
        // It may wait: answered after its headers (see `api::deferred`).
        let (this, req) = (self.owned()?, deferred::Held::new(req));
        Ok(deferred::defer(async move {
            this.poll_for_error_routed(req.take()).await
        }))
    }
}

/// A task's record as TensorFlow reports it; `asked` is the task as the request named it (its
/// `recoverable` flag is echoed, as TF's service does).
fn task_state_info(
    t: &coord_raft_store::state::TaskName,
    r: &coord_raft_store::state::TaskRecord,
    asked: Option<&tf::CoordinatedTask>,
) -> tf::CoordinatedTaskStateInfo {
    let e = r.error.as_ref();
    tf::CoordinatedTaskStateInfo {
        task: Some(asked.cloned().unwrap_or_else(|| task_to(t))),
        incarnation: r.incarnation,
        state: state_to(r.state) as i32,
        error_code: e.map_or(0, |e| grpc_code(e.code) as i32),
        error_message: e.map_or_else(String::new, |e| e.message.clone()),
        // As TensorFlow's service describes a task's error: the task itself, not "reported".
        error_payload: e.map(|_| tf::CoordinationServiceError {
            is_reported_error: false,
            source_task: Some(task_to(t)),
        }),
    }
}

/// The calls that may wait, as the router drives them; the trait's methods defer them. Not
/// `async fn`s: one keeps its request beside the route it is handed to, for as long as it waits.
impl TfService {
    fn get_key_value_routed(
        &self,
        req: Request<tf::GetKeyValueRequest>,
    ) -> impl Future<Output = Result<Response<tf::GetKeyValueResponse>, Status>> + '_ {
        let kv = &*self.kv;
        self.router
            .route(
                "GetKeyValue",
                Kind::Read,
                req,
                move |m, _| async move {
                    let (_, value) = kv.get(&m.key).await?;
                    Ok(tf::GetKeyValueResponse {
                        kv: Some(entry(m.key, value)),
                    })
                },
                move |ch, r| {
                    self.reads.answer(
                        ch,
                        r,
                        |ch, r| async move { client(ch).get_key_value(r).await },
                    )
                },
            )
            .map(move |a| a.map(|a| self.values.attach("GetKeyValue", a)))
    }

    fn get_alive_tasks_routed(
        &self,
        req: Request<tf::GetAliveTasksRequest>,
    ) -> impl Future<Output = Result<Response<tf::GetAliveTasksResponse>, Status>> + '_ {
        if let Err(s) = self.router.check_task(
            &req,
            "GetAliveTasks",
            "requesting_task",
            req.get_ref().requesting_task.as_ref(),
        ) {
            return Either::Left(std::future::ready(Err(s)));
        }
        let core = &*self.coord;
        Either::Right(self.router.route(
            "GetAliveTasks",
            Kind::Write,
            req,
            move |m, id| {
                served(async move {
                    let source = task_from(m.requesting_task.as_ref(), "requesting_task")?;
                    let tasks = tasks_from(&m.tasks, "tasks")?;
                    let set = TaskSet::of_tasks(&tasks);
                    let answer = core.get_alive(id, source, set).await?;
                    // Index-aligned and in incarnation order: TF's service sorts the
                    // incarnations on their own, and its agent pairs them by index.
                    let mut alive: Vec<_> = answer.iter().collect();
                    alive.sort_by_key(|(_, incarnation)| *incarnation);
                    Ok(tf::GetAliveTasksResponse {
                        alive_tasks: alive.iter().map(|(t, _)| task_to(t)).collect(),
                        incarnations: alive.iter().map(|(_, i)| *i).collect(),
                    })
                })
            },
            |ch, r| async move { client(ch).get_alive_tasks(r).await },
        ))
    }

    fn poll_for_error_routed(
        &self,
        req: Request<tf::PollForErrorRequest>,
    ) -> impl Future<Output = Result<Response<tf::PollForErrorResponse>, Status>> + '_ {
        if let Err(s) = self.router.check_task(
            &req,
            "PollForError",
            "source_task",
            req.get_ref().source_task.as_ref(),
        ) {
            return Either::Left(std::future::ready(Err(s)));
        }
        let core = &*self.coord;
        Either::Right(self.router.route(
            "PollForError",
            Kind::Read,
            req,
            move |m, _| {
                served(async move {
                    let task = task_from(m.source_task.as_ref(), "source_task")?;
                    let e = core.poll_error_since_register(task).await?;
                    // The error is the answer: the poll ends with it.
                    Err::<tf::PollForErrorResponse, _>(propagated(&e))
                })
            },
            |ch, r| async move { client(ch).poll_for_error(r).await },
        ))
    }
}

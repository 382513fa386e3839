//! The RPCs of `xla.coordination.CoordinationService` (see the [module above](super)).

use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_server::CoordinationService;
use coord_raft_store::state::Outcome;
use futures::future::Either;
use futures::FutureExt;
use std::future::Future;
use tonic::{Request, Response, Status};

use super::errors::{barrier_error, polled};
use crate::api::deferred;
use crate::error::CoordError;
use crate::serve::route::Kind;

use super::{client, entry, served, XlaService};

#[tonic::async_trait]
impl CoordinationService for XlaService {
    async fn register_task(
        &self,
        req: Request<xla::RegisterTaskRequest>,
    ) -> Result<Response<xla::RegisterTaskResponse>, Status> {
        // It waits at the register barrier: answered after its headers (see `api::deferred`).
        let (this, req) = (self.owned()?, deferred::Held::new(req));
        Ok(deferred::defer(async move {
            this.register_task_routed(req.take()).await
        }))
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
        self.watch_tasks_call(req).await
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
        // It may wait: answered after its headers (see `api::deferred`).
        let (this, req) = (self.owned()?, deferred::Held::new(req));
        Ok(deferred::defer(async move {
            this.get_key_value_routed(req.take()).await
        }))
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
            .map(|a| self.values.attach("xla/TryGetKeyValue", a))
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
            .map(|a| self.values.attach("xla/GetKeyValueDir", a))
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

    /// Not an `async fn`, as TensorFlow's Barrier (`api::tf`): a parked call's future holds no
    /// copy of the request.
    fn barrier<'life0, 'async_trait>(
        &'life0 self,
        req: Request<xla::BarrierRequest>,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<Response<xla::BarrierResponse>, Status>>
                + Send
                + 'async_trait,
        >,
    >
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        let checked = self.acting_as(
            &req,
            "xla/Barrier",
            "source_task_id",
            req.get_ref().source_task_id,
        );
        let owned = match checked.and_then(|()| self.owned()) {
            Ok(owned) => owned,
            Err(s) => return Box::pin(std::future::ready(Err(s))),
        };
        // Answered after its headers (see `api::deferred`).
        let req = deferred::Held::new(req);
        Box::pin(std::future::ready(Ok(deferred::defer(async move {
            let this = &*owned;
            this.router
                .route(
                    "xla/Barrier",
                    Kind::Write,
                    req.take(),
                    move |m, id| {
                        // Combinators, not an `async` block, which would keep room for `m` beside
                        // the arrival it is moved into (see `Router::route`).
                        let (barrier_id, counter) = (m.barrier_id.clone(), m.counter);
                        let named = this.barrier_named(&m);
                        this.coord
                            .barrier(id, m.barrier_id, m.counter, m.barrier_timeout_in_ms, named)
                            .map(move |passed| match passed {
                                Ok(counter) => Ok(xla::BarrierResponse { counter }),
                                Err(e) => Err(barrier_error(e, &barrier_id, counter)),
                            })
                    },
                    |ch, r| async move { client(ch).barrier(r).await },
                )
                .await
        }))))
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
        // It waits for the set: answered after its headers (see `api::deferred`).
        let (this, req) = (self.owned()?, deferred::Held::new(req));
        Ok(deferred::defer(async move {
            this.get_alive_call(req.take()).await
        }))
    }

    async fn poll_for_error(
        &self,
        req: Request<xla::PollForErrorRequest>,
    ) -> Result<Response<xla::PollForErrorResponse>, Status> {
        // It may wait: answered after its headers (see `api::deferred`).
        let (this, req) = (self.owned()?, deferred::Held::new(req));
        Ok(deferred::defer(async move {
            this.poll_for_error_routed(req.take()).await
        }))
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

/// The calls that may wait, as the router drives them; the trait's methods defer them. Not
/// `async fn`s: one keeps its request beside the route it is handed to, for as long as it waits.
impl XlaService {
    fn register_task_routed(
        &self,
        req: Request<xla::RegisterTaskRequest>,
    ) -> impl Future<Output = Result<Response<xla::RegisterTaskResponse>, Status>> + '_ {
        if let Err(s) = self.acting_as(
            &req,
            "xla/RegisterTask",
            "source_task_id",
            req.get_ref().source_task_id,
        ) {
            return Either::Left(std::future::ready(Err(s)));
        }
        let this = self;
        Either::Right(self.router.route(
            "xla/RegisterTask",
            Kind::Write,
            req,
            move |m, id| {
                let called = this
                    .task(m.source_task_id, "source_task_id")
                    .and_then(|task| Ok((task, this.whole_job()?)));
                let registered = match called {
                    Ok((task, all)) => {
                        Either::Left(this.coord.register_at_barrier(id, task, m.incarnation, all))
                    }
                    Err(e) => Either::Right(std::future::ready(Err(e))),
                };
                served(registered.map(|registered| {
                    Ok(xla::RegisterTaskResponse {
                        service_incarnation: registered?,
                    })
                }))
            },
            |ch, r| async move { client(ch).register_task(r).await },
        ))
    }

    fn get_key_value_routed(
        &self,
        req: Request<xla::GetKeyValueRequest>,
    ) -> impl Future<Output = Result<Response<xla::GetKeyValueResponse>, Status>> + '_ {
        let this = self;
        self.router
            .route(
                "xla/GetKeyValue",
                Kind::Read,
                req,
                move |m, _| {
                    served(async move {
                        this.check_incarnation(m.incarnations.as_ref())?;
                        let (key, value) = this.kv.get(&m.key).await?;
                        Ok(xla::GetKeyValueResponse {
                            kv: Some(entry(key, value)),
                        })
                    })
                },
                move |ch, r| {
                    this.reads.answer(
                        ch,
                        r,
                        |ch, r| async move { client(ch).get_key_value(r).await },
                    )
                },
            )
            .map(move |a| a.map(|a| self.values.attach("xla/GetKeyValue", a)))
    }

    fn poll_for_error_routed(
        &self,
        req: Request<xla::PollForErrorRequest>,
    ) -> impl Future<Output = Result<Response<xla::PollForErrorResponse>, Status>> + '_ {
        if let Err(s) = self.acting_as(
            &req,
            "xla/PollForError",
            "source_task_id",
            req.get_ref().source_task_id,
        ) {
            return Either::Left(std::future::ready(Err(s)));
        }
        let this = self;
        Either::Right(self.router.route(
            "xla/PollForError",
            Kind::Read,
            req,
            move |m, _| {
                served(async move {
                    this.check_incarnation(m.incarnations.as_ref())?;
                    let task = this.task(m.source_task_id, "source_task_id")?;
                    let e = this.coord.poll_error_since_register(task).await?;
                    // The error is the answer: the poll ends with it.
                    Err::<xla::PollForErrorResponse, _>(polled(&e))
                })
            },
            |ch, r| async move { client(ch).poll_for_error(r).await },
        ))
    }
}

//! The calls that park until the whole job arrives: WaitForAllTasks and Barrier.
//!
//! Their trait methods are written without `async fn`: `async_trait` would box a future holding
//! the request twice (an `async fn` keeps its arguments beside the copies it moves into its
//! body), and a parked call keeps its future for as long as it waits. Here the request is checked
//! and handed to [`Router::route`](crate::serve::route::Router::route), which reads what it needs
//! off it, before the call's future is boxed.

use coord_proto::tensorflow as tf;
use futures::future::Either;
use futures::FutureExt;
use tonic::{Request, Response, Status};

use super::{client, devices_of, served, AnswerForm, TfService};
use crate::api::deferred;
use crate::api::payloads::barrier_error;
use crate::api::wire::{task_from, tasks_from};
use crate::serve::route::Kind;

/// What a `tensorflow.CoordinationService` method returns (what `async_trait` makes of an
/// `async fn`), for the methods written without one.
pub(super) type Answer<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response<T>, Status>> + Send + 'a>>;

impl TfService {
    /// WaitForAllTasks: the job's devices once every task has called.
    pub(super) fn wait_for_all_call(
        &self,
        req: Request<tf::WaitForAllTasksRequest>,
    ) -> Answer<'_, tf::WaitForAllTasksResponse> {
        let checked = self.router.check_task(
            &req,
            "WaitForAllTasks",
            "source_task",
            req.get_ref().source_task.as_ref(),
        );
        let owned = match checked.and_then(|()| self.owned()) {
            Ok(owned) => owned,
            Err(s) => return Box::pin(std::future::ready(Err(s))),
        };
        // Answered after its headers (see `api::deferred`): the call's own future is all a parked
        // call keeps.
        let req = deferred::Held::new(req);
        Box::pin(std::future::ready(Ok(deferred::defer(async move {
            let this = &*owned;
            let core = &*this.coord;
            let mut answer = this
                .router
                .route(
                    "WaitForAllTasks",
                    Kind::Write,
                    req.take(),
                    move |m, id| {
                        // Combinators, not an `async` block, which would keep room for `m` beside
                        // the arrival it is moved into (see `Router::route`).
                        let called = task_from(m.source_task.as_ref(), "source_task")
                            .and_then(|task| Ok((task, devices_of(&m)?)));
                        let form = AnswerForm::of(&m);
                        let waited = match called {
                            Ok((task, devices)) => {
                                Either::Left(core.wait_for_all(id, task, devices))
                            }
                            Err(e) => Either::Right(std::future::ready(Err(e))),
                        };
                        served(waited.map(move |waited| {
                            let (leader_incarnation, all) = waited?;
                            Ok(tf::WaitForAllTasksResponse {
                                leader_incarnation,
                                encoded: this.device_fields(form, &all)?,
                                ..Default::default()
                            })
                        }))
                    },
                    |ch, r| this.relay_wait_for_all(ch, r),
                )
                .await?;
            // Sent from the one buffer every task's answer shares (see `api::shared_answer`).
            if let Some(shared) = this.shared_answer(answer.get_ref()) {
                answer.extensions_mut().insert(shared);
            }
            Ok(answer)
        }))))
    }

    /// Barrier: the instance's counter once every participant has arrived.
    pub(super) fn barrier_call(
        &self,
        req: Request<tf::BarrierRequest>,
    ) -> Answer<'_, tf::BarrierResponse> {
        let checked = self.router.check_task(
            &req,
            "Barrier",
            "source_task",
            req.get_ref().source_task.as_ref(),
        );
        let owned = match checked.and_then(|()| self.owned()) {
            Ok(owned) => owned,
            Err(s) => return Box::pin(std::future::ready(Err(s))),
        };
        let req = deferred::Held::new(req);
        Box::pin(std::future::ready(Ok(deferred::defer(async move {
            let core = &*owned.coord;
            owned
                .router
                .route(
                    "Barrier",
                    Kind::Write,
                    req.take(),
                    move |m, id| {
                        // Combinators, not an `async` block, which would keep room for `m` beside
                        // the arrival it is moved into (see `Router::route`).
                        let (barrier_id, counter) = (m.barrier_id.clone(), m.counter);
                        let named = task_from(m.source_task.as_ref(), "source_task")
                            .and_then(|s| Ok((s, tasks_from(&m.tasks, "tasks")?)));
                        core.barrier(id, m.barrier_id, m.counter, m.barrier_timeout_in_ms, named)
                            .map(move |passed| match passed {
                                Ok(counter) => Ok(tf::BarrierResponse { counter }),
                                Err(e) => Err(barrier_error(e, &barrier_id, counter)),
                            })
                    },
                    |ch, r| async move { client(ch).barrier(r).await },
                )
                .await
        }))))
    }
}

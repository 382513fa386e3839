//! The data worker: heartbeats the dispatcher, runs the tasks it is given and serves their
//! elements to consumers directly (`coord.dispatcher.DataWorker`), so a coordinator failover
//! never stalls a read in progress.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use coord_proto::coord::dispatcher as pb;
use coord_proto::coord::dispatcher::data_worker_server::DataWorker;
use tonic::{Request, Response, Status};

use super::dispatcher::DispatchClient;
use super::task::{Answer, TaskRunner};

#[derive(Clone)]
pub struct DataWorkerService {
    inner: Arc<Inner>,
}

struct Inner {
    /// The address consumers reach this worker at; also its name to the dispatcher.
    address: String,
    dispatcher: DispatchClient,
    tasks: Mutex<HashMap<u64, Arc<TaskRunner>>>,
}

impl DataWorkerService {
    pub fn new(address: String, dispatcher: DispatchClient) -> Self {
        Self {
            inner: Arc::new(Inner {
                address,
                dispatcher,
                tasks: Mutex::new(HashMap::new()),
            }),
        }
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<TaskRunner>>> {
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Heartbeats the dispatcher every `interval`, forever: takes on new tasks, drops deleted
    /// ones, reports delivered splits and finished tasks.
    pub async fn heartbeat_loop(self, interval: Duration) {
        loop {
            if let Err(e) = self.heartbeat_once().await {
                tracing::warn!(error = %e.message(), "dispatcher heartbeat failed; retrying");
            }
            tokio::time::sleep(interval).await;
        }
    }

    pub async fn heartbeat_once(&self) -> Result<(), Status> {
        let current: Vec<u64> = self.tasks().keys().copied().collect();
        let reply = self
            .inner
            .dispatcher
            .worker_heartbeat(pb::WorkerHeartbeatRequest {
                worker_address: self.inner.address.clone(),
                current_tasks: current,
            })
            .await?;
        for t in reply.tasks_to_delete {
            if let Some(task) = self.tasks().remove(&t) {
                tracing::info!(task = t, "task deleted by the dispatcher");
                task.stop();
            }
        }
        for def in reply.new_tasks {
            let id = def.task_id;
            match TaskRunner::new(def) {
                Ok(task) => {
                    tracing::info!(task = id, "task started");
                    self.tasks().insert(id, task.clone());
                    tokio::spawn(task.produce(self.inner.dispatcher.clone()));
                }
                Err(e) => tracing::warn!(task = id, error = %e, "cannot run task"),
            }
        }
        self.report().await
    }

    /// Sends delivered splits and finished tasks to the dispatcher.
    async fn report(&self) -> Result<(), Status> {
        let tasks: Vec<Arc<TaskRunner>> = self.tasks().values().cloned().collect();
        let mut taken = Vec::new();
        let mut req = pb::WorkerUpdateRequest {
            worker_address: self.inner.address.clone(),
            ..Default::default()
        };
        for t in tasks {
            let (done, complete) = t.take_report();
            let id = t.def.task_id;
            req.splits_done.extend(done.iter().map(|s| pb::SplitDone {
                task_id: id,
                split: *s,
            }));
            if complete {
                req.tasks_completed.push(id);
            }
            if !done.is_empty() || complete {
                taken.push((t, done, complete));
            }
        }
        if taken.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.inner.dispatcher.worker_update(req).await {
            for (t, done, complete) in taken {
                t.restore_report(done, complete);
            }
            return Err(e);
        }
        Ok(())
    }

    pub fn task_count(&self) -> usize {
        self.tasks().len()
    }
}

#[tonic::async_trait]
impl DataWorker for DataWorkerService {
    async fn get_element(
        &self,
        req: Request<pb::GetElementRequest>,
    ) -> Result<Response<pb::GetElementResponse>, Status> {
        let req = req.into_inner();
        let Some(task) = self.tasks().get(&req.task_id).cloned() else {
            return Err(Status::not_found(format!(
                "task {} is not running on worker {}",
                req.task_id, self.inner.address
            )));
        };
        let answer = match (req.consumer_index, req.round) {
            (Some(c), Some(r)) => task.round(c, r)?,
            (None, None) => task.next()?,
            _ => {
                return Err(Status::invalid_argument(
                    "consumer_index and round go together (round-robin reads) or not at all",
                ))
            }
        };
        Ok(Response::new(match answer {
            Answer::Element(e) => pb::GetElementResponse {
                data: e.data,
                split: e.split,
                offset: e.offset,
                ..Default::default()
            },
            Answer::Retry => pb::GetElementResponse {
                retry: true,
                ..Default::default()
            },
            Answer::EndOfSequence => pb::GetElementResponse {
                end_of_sequence: true,
                ..Default::default()
            },
        }))
    }
}

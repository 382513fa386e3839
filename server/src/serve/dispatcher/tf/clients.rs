//! TensorFlow's tf.data clients (consumers): GetOrCreateIteration, ClientHeartbeat,
//! ReleaseIterationClient, and MaybeRemoveTask, by which round-robin consumers retire a task.

use coord_proto::tensorflow::data as pb;
use coord_raft_store::dispatcher::{sharding, DispatcherOp, DispatcherOutput};
use coord_raft_store::state::Code;
use coord_raft_store::{Output, RequestId};

use super::{status, wire};
use crate::error::CoordError;
use crate::serve::dispatcher::{now_micros, remover, unexpected, DispatcherCore};

impl DispatcherCore {
    pub async fn get_or_create_iteration(
        &self,
        id: Option<RequestId>,
        req: pb::GetOrCreateIterationRequest,
    ) -> Result<pb::GetOrCreateIterationResponse, CoordError> {
        let (policy, dataset) = self
            .read(|s| {
                s.jobs
                    .get(&req.job_id)
                    .map(|j| (j.sharding, j.dataset.clone()))
            })
            .await?
            .ok_or_else(|| {
                status(
                    Code::NotFound,
                    format!("Job with id {} not found", req.job_id),
                )
            })?;
        if sharding::is_static(policy) && self.config.worker_addresses.is_empty() {
            // TF makes the iteration, then fails to give its tasks a worker index; nothing is
            // written here.
            let worker = self
                .applied(|s| s.workers.keys().next().cloned())
                .unwrap_or_else(|| "(any)".into());
            return Err(status(
                Code::NotFound,
                format!(
                    "Failed to shard dataset in tf.data service: Worker {worker} is not in the \
                     workers list. Got workers list . Static sharding ({}) needs the fixed list \
                     of workers (TF's DispatcherConfig.worker_addresses): start every \
                     coordinator with --tfdata-worker-addresses",
                    sharding::name(policy)
                ),
            ));
        }
        let providers = if policy == sharding::DYNAMIC {
            self.dynamic_providers(&dataset).await?
        } else {
            Vec::new()
        };
        let op = DispatcherOp::GetOrCreateIteration {
            job: req.job_id,
            repetition: req.repetition,
            providers,
        };
        let (client, new_tasks) = match self.commit(id, op).await? {
            DispatcherOutput::Iteration {
                client, new_tasks, ..
            } => (client, new_tasks),
            other => {
                return Err(unexpected(
                    "get_or_create_iteration",
                    &Output::Dispatcher(other),
                ))
            }
        };
        self.memory().client_acquired(client);
        // As TF does before it answers: hand the new tasks to their workers.
        let defs: Vec<(String, pb::TaskDef)> = self.applied(|s| {
            new_tasks
                .iter()
                .filter_map(|t| s.tasks.get(t))
                .filter_map(|t| Some((t.worker.clone(), wire::task_def(s, t).ok()?)))
                .collect()
        });
        self.push.push(defs).await;
        Ok(pb::GetOrCreateIterationResponse {
            iteration_client_id: client,
        })
    }

    pub async fn release_client(
        &self,
        id: Option<RequestId>,
        client: i64,
    ) -> Result<(), CoordError> {
        let op = DispatcherOp::ReleaseClient {
            client,
            time_micros: now_micros(),
        };
        self.commit(id, op).await?;
        self.memory().forget_client(client);
        Ok(())
    }

    pub async fn client_heartbeat(
        &self,
        id: Option<RequestId>,
        req: pb::ClientHeartbeatRequest,
    ) -> Result<pb::ClientHeartbeatResponse, CoordError> {
        let client = req.iteration_client_id;
        let current_round = req
            .optional_current_round
            .map(|pb::client_heartbeat_request::OptionalCurrentRound::CurrentRound(r)| r);
        let blocked_round = req
            .optional_blocked_round
            .map(|pb::client_heartbeat_request::OptionalBlockedRound::BlockedRound(r)| r);
        self.client_rounds(id, client, (current_round, blocked_round), |s| {
            let it = s.client_iteration(client)?;
            if it.garbage_collected {
                return Err(status(
                    Code::FailedPrecondition,
                    "The requested iteration has been garbage collected due to inactivity. \
                     Consider configuring the dispatcher with a higher \
                     `iteration_gc_timeout_ms`."
                        .into(),
                ));
            }
            Ok(())
        })
        .await?;
        self.applied(|s| {
            let it = s.client_iteration(client)?;
            Ok(pb::ClientHeartbeatResponse {
                task_info: wire::task_infos(s, it)?,
                optional_block_round: it.pending.front().map(|p| {
                    pb::client_heartbeat_response::OptionalBlockRound::BlockRound(p.target_round)
                }),
                iteration_finished: it.finished,
                deployment_mode: pb::DeploymentMode::Unspecified as i32,
            })
        })
    }

    pub async fn maybe_remove_task(
        &self,
        id: Option<RequestId>,
        req: pb::MaybeRemoveTaskRequest,
    ) -> Result<pb::MaybeRemoveTaskResponse, CoordError> {
        let consumers = self
            .read(|s| {
                let task = s.tasks.get(&req.task_id)?;
                let it = s.iterations.get(&task.iteration)?;
                Some(s.jobs.get(&it.job).and_then(|j| j.num_consumers))
            })
            .await?;
        let consumers = match consumers {
            None => return Ok(pb::MaybeRemoveTaskResponse { removed: true }),
            Some(None) => {
                return Err(status(
                    Code::FailedPrecondition,
                    "MaybeRemoveTask called on a non-round-robin task.".into(),
                ))
            }
            Some(Some(n)) => n,
        };
        let removed = self
            .memory()
            .remover(req.task_id, consumers)
            .request_removal(req.consumer_index, req.round, remover::WAIT)
            .await;
        if removed {
            self.commit(id, DispatcherOp::RemoveTask { task: req.task_id })
                .await?;
        }
        Ok(pb::MaybeRemoveTaskResponse { removed })
    }
}

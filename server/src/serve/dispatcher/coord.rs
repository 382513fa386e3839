//! coord's own dispatcher protocol (`coord.dispatcher.Dispatcher`) over the one dispatcher
//! state: coord's data workers and consumers. A thin adapter: it translates coord's messages
//! (u64 ids, coord's `DatasetDef`, GetSplit by task with delivered splits) into the state's ops
//! and reads its answers back, with coord's words for coord's errors.
//!
//! In the state a coord dataset is a definition, a coord job is a job read once (its iteration's
//! id is the job id coord's clients see), and coord's workers report delivery, so their splits
//! are leased and go out again when a worker dies.

use std::collections::HashSet;

use bytes::Bytes;
use coord_proto::coord::dispatcher as pb;
use coord_proto::dataset::{fingerprint, Plan};
use coord_raft_store::dispatcher::{
    DatasetSource, DispatcherOp, DispatcherOutput, DispatcherState, Iteration, LeaseAnswer, Task,
};
use coord_raft_store::{Output, RequestId};
use prost::Message;

use super::{now_micros, unexpected, DispatcherCore};
use crate::error::CoordError;

/// The most splits one GetSplit leases.
pub const MAX_SPLITS_PER_LEASE: u32 = 1024;

fn answer(what: &str, out: DispatcherOutput) -> CoordError {
    unexpected(what, &Output::Dispatcher(out))
}

/// coord's error for an id the dispatcher does not know.
pub fn not_found(what: &str, id: impl std::fmt::Display) -> CoordError {
    CoordError::status(
        coord_raft_store::state::Code::NotFound,
        format!("{what} {id} is not known to the dispatcher"),
    )
}

/// A u64 id of coord's wire as the state's (TensorFlow's i64 ids); past i64 no id exists.
fn id(what: &str, wire: u64) -> Result<i64, CoordError> {
    i64::try_from(wire).map_err(|_| not_found(what, wire))
}

fn wire(id: i64) -> u64 {
    u64::try_from(id).unwrap_or(0)
}

/// The iteration a coord client reads, if the client is known.
fn client_iteration(s: &DispatcherState, client: i64) -> Option<&Iteration> {
    s.clients.get(&client).and_then(|i| s.iterations.get(i))
}

impl DispatcherCore {
    pub async fn register_definition(
        &self,
        id: Option<RequestId>,
        def: Option<pb::DatasetDef>,
    ) -> Result<pb::GetOrRegisterDatasetResponse, CoordError> {
        let def = def.ok_or_else(|| {
            CoordError::InvalidArgument("GetOrRegisterDataset needs a dataset definition".into())
        })?;
        let plan = Plan::new(&def)
            .map_err(|e| CoordError::InvalidArgument(format!("malformed dataset: {e}")))?;
        let fp = fingerprint(&def);
        let op = DispatcherOp::RegisterDefinition {
            fingerprint: fp,
            def: Bytes::from(def.encode_to_vec()),
            total_splits: plan.total_splits(),
        };
        match self.commit(id, op).await? {
            DispatcherOutput::Definition { id, created } => Ok(pb::GetOrRegisterDatasetResponse {
                dataset_id: id.parse().map_err(|_| {
                    CoordError::Internal(format!("definition {id:?} has no number"))
                })?,
                fingerprint: fp,
                created,
            }),
            other => Err(answer("register_dataset", other)),
        }
    }

    pub async fn definition(&self, dataset: u64) -> Result<pb::DatasetDef, CoordError> {
        let bytes = self
            .read(
                |s| match s.datasets.get(&dataset.to_string()).map(|d| &d.source) {
                    Some(DatasetSource::Definition { def, .. }) => Some(def.clone()),
                    _ => None,
                },
            )
            .await?
            .ok_or_else(|| not_found("dataset", dataset))?;
        pb::DatasetDef::decode(bytes).map_err(|e| {
            CoordError::Internal(format!("stored dataset {dataset} does not decode: {e}"))
        })
    }

    pub async fn join_job(
        &self,
        id: Option<RequestId>,
        req: pb::GetOrCreateJobRequest,
    ) -> Result<pb::GetOrCreateJobResponse, CoordError> {
        if pb::ProcessingMode::try_from(req.mode).is_err() {
            return Err(CoordError::InvalidArgument(format!(
                "processing mode {} is not one of OFF (0), DYNAMIC (1), FILE (2), DATA (3)",
                req.mode
            )));
        }
        if req.job_name.as_deref() == Some("") {
            return Err(CoordError::InvalidArgument(
                "job_name must not be empty (leave it out for an anonymous job)".into(),
            ));
        }
        let num_consumers = req
            .num_consumers
            .map(|n| {
                i64::try_from(n).map_err(|_| {
                    CoordError::InvalidArgument(format!("num_consumers {n} is out of range"))
                })
            })
            .transpose()?;
        let op = DispatcherOp::JoinJob {
            dataset: req.dataset_id.to_string(),
            sharding: req.mode,
            name: req.job_name,
            anonymous_tag: rand::random::<u64>(),
            num_consumers,
        };
        match self.commit(id, op).await? {
            DispatcherOutput::Iteration {
                iteration, client, ..
            } => {
                // coord's clients are released when silent, even before their first heartbeat.
                self.memory().client_heard(client, None);
                Ok(pb::GetOrCreateJobResponse {
                    job_id: wire(iteration),
                    client_id: wire(client),
                })
            }
            other => Err(answer("get_or_create_job", other)),
        }
    }

    pub async fn release_job_client(
        &self,
        id: Option<RequestId>,
        client: u64,
    ) -> Result<(), CoordError> {
        let c = self::id("job client", client)?;
        if !self.read(|s| s.clients.contains_key(&c)).await? {
            return Err(not_found("job client", client));
        }
        let op = DispatcherOp::ReleaseClient {
            client: c,
            time_micros: now_micros(),
        };
        self.commit(id, op).await?;
        self.memory().forget_client(c);
        Ok(())
    }

    pub async fn job_client_heartbeat(
        &self,
        id: Option<RequestId>,
        req: pb::ClientHeartbeatRequest,
    ) -> Result<pb::ClientHeartbeatResponse, CoordError> {
        let client = self::id("job client", req.client_id)?;
        let rounds = (req.current_round, req.blocked_round);
        self.client_rounds(id, client, rounds, |s| {
            match s.clients.contains_key(&client) {
                true => Ok(()),
                false => Err(not_found("job client", req.client_id)),
            }
        })
        .await?;
        Ok(self.applied(|s| match client_iteration(s, client) {
            None => pb::ClientHeartbeatResponse {
                job_finished: true,
                ..Default::default()
            },
            Some(it) => pb::ClientHeartbeatResponse {
                job_id: wire(it.id),
                tasks: task_infos(s, it),
                block_round: it.pending.front().map(|p| p.target_round),
                job_finished: it.finished,
            },
        }))
    }

    pub async fn data_worker_heartbeat(
        &self,
        id: Option<RequestId>,
        req: pb::WorkerHeartbeatRequest,
    ) -> Result<pb::WorkerHeartbeatResponse, CoordError> {
        let address = req.worker_address;
        if address.is_empty() {
            return Err(CoordError::InvalidArgument(
                "worker_address must not be empty".into(),
            ));
        }
        self.memory().worker_heard(&address);
        let (known, rounds) = self
            .read(|s| {
                let known = s
                    .workers
                    .get(&address)
                    .filter(|w| w.reports_delivery && !w.lost)
                    .map(|w| w.registration);
                (known, self.memory().iteration_rounds(s))
            })
            .await?;
        let registration = match known {
            Some(r) => r,
            None => {
                let op = DispatcherOp::RegisterDataWorker {
                    address: address.clone(),
                    rounds,
                };
                match self.commit(id, op).await? {
                    DispatcherOutput::Registered(r) => {
                        tracing::info!(worker = %address, registration = r, "data worker registered");
                        r
                    }
                    other => return Err(answer("register_worker", other)),
                }
            }
        };
        let current: HashSet<u64> = req.current_tasks.iter().copied().collect();
        Ok(self.applied(|s| {
            let mine = |t: &Task| t.worker == address && t.registration == registration;
            let new_tasks = s
                .tasks
                .values()
                .filter(|t| mine(t) && !t.removed && !t.finished)
                .filter(|t| !current.contains(&wire(t.id)))
                .filter_map(|t| task_def(s, t))
                .collect();
            // Tasks it should stop: unknown, removed, of another registration, or of a job
            // collected. A finished task stays: it answers end-of-sequence to its consumers.
            let tasks_to_delete = req
                .current_tasks
                .iter()
                .copied()
                .filter(|t| {
                    let task = i64::try_from(*t).ok().and_then(|t| s.tasks.get(&t));
                    task.is_none_or(|t| {
                        t.removed
                            || !mine(t)
                            || s.iterations
                                .get(&t.iteration)
                                .is_none_or(|it| it.garbage_collected)
                    })
                })
                .collect();
            pb::WorkerHeartbeatResponse {
                new_tasks,
                tasks_to_delete,
                worker_id: registration,
            }
        }))
    }

    pub async fn report_delivery(
        &self,
        id: Option<RequestId>,
        req: pb::WorkerUpdateRequest,
    ) -> Result<(), CoordError> {
        let task = |t: u64| self::id("task", t);
        let op = DispatcherOp::ReportDelivery {
            address: req.worker_address,
            done: req
                .splits_done
                .iter()
                .map(|d| Ok((task(d.task_id)?, d.split)))
                .collect::<Result<_, CoordError>>()?,
            completed: req
                .tasks_completed
                .iter()
                .map(|t| task(*t))
                .collect::<Result<_, _>>()?,
        };
        self.commit(id, op).await?;
        Ok(())
    }

    pub async fn lease_splits(
        &self,
        id: Option<RequestId>,
        req: pb::GetSplitRequest,
    ) -> Result<pb::GetSplitResponse, CoordError> {
        let op = DispatcherOp::LeaseSplits {
            task: self::id("task", req.task_id)?,
            done: req.splits_done,
            max: req.max_splits.clamp(1, MAX_SPLITS_PER_LEASE),
        };
        match self.commit(id, op).await? {
            DispatcherOutput::Lease(a) => Ok(match a {
                LeaseAnswer::Splits(splits) => pb::GetSplitResponse {
                    splits,
                    ..Default::default()
                },
                LeaseAnswer::Retry => pb::GetSplitResponse {
                    retry: true,
                    ..Default::default()
                },
                LeaseAnswer::EndOfSplits => pb::GetSplitResponse {
                    end_of_splits: true,
                    ..Default::default()
                },
            }),
            other => Err(answer("get_split", other)),
        }
    }
}

fn task_infos(s: &DispatcherState, it: &Iteration) -> Vec<pb::TaskInfo> {
    s.iteration_tasks(it)
        .map(|t| pb::TaskInfo {
            task_id: wire(t.id),
            worker_address: t.worker.clone(),
            starting_round: t.starting_round,
        })
        .collect()
}

fn task_def(s: &DispatcherState, t: &Task) -> Option<pb::TaskDef> {
    let it = s.iterations.get(&t.iteration)?;
    let job = s.jobs.get(&it.job)?;
    let DatasetSource::Definition { def, .. } = &s.datasets.get(&job.dataset)?.source else {
        return None;
    };
    Some(pb::TaskDef {
        task_id: wire(t.id),
        job_id: wire(it.id),
        dataset_id: job.dataset.parse().ok()?,
        dataset: pb::DatasetDef::decode(def.clone()).ok(),
        mode: job.sharding,
        shard_index: t.shard_index,
        num_shards: it.num_shards,
        num_consumers: job.num_consumers.and_then(|n| u64::try_from(n).ok()),
    })
}

//! The tf.data dispatcher, served by the leader: every state change is one Raft command (the log is
//! the journal, see `coord_raft_store::dispatcher`); reads wait for the read index and read the
//! applied state.
//!
//! What TF keeps in memory stays in the leader's memory ([`memory`]): when workers and clients
//! last heartbeated and the round each round-robin job is on. A new leader starts with none of it
//! and gives everyone a full timeout of grace.
//!
//! - [`memory`]: the leader's soft state.
//! - [`timers`]: worker and client timeouts, job collection.
//! - [`service`]: the `coord.dispatcher.Dispatcher` gRPC service.
//! - [`journal`]: the journal, read back from the Raft log.
//! - [`metrics`]: jobs, workers and splits on `/metrics`.

pub mod journal;
pub mod memory;
pub mod metrics;
pub mod timers;

use std::sync::Arc;

use bytes::Bytes;
use coord_proto::coord::dispatcher as pb;
use coord_proto::dataset::{fingerprint, Plan};
use coord_raft_store::dispatcher::{
    DispatchOp, DispatchOutput, DispatcherState, Job, Mode, SplitAnswer,
};
use coord_raft_store::storage::StateReader;
use coord_raft_store::{Command, Op, Output, RequestId};
use prost::Message;

use crate::error::CoordError;
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;
use memory::Memory;

/// The most splits one GetSplit leases.
pub const MAX_SPLITS_PER_LEASE: u32 = 1024;

/// Timeouts of the dispatcher (flags of the coordinator).
#[derive(Clone, Copy, Debug)]
pub struct DispatchConfig {
    pub worker_timeout_ms: u64,
    pub client_timeout_ms: u64,
    pub job_gc_timeout_ms: u64,
}

impl DispatchConfig {
    pub fn from_args(args: &crate::ops::config::Args) -> Self {
        Self {
            worker_timeout_ms: args.dispatcher_worker_timeout_ms,
            client_timeout_ms: args.dispatcher_client_timeout_ms,
            job_gc_timeout_ms: args.dispatcher_job_gc_timeout_ms,
        }
    }
}

pub struct DispatchCore {
    pub proposer: Proposer,
    pub read_index: ReadIndex,
    pub reader: StateReader,
    pub memory: Arc<Memory>,
    pub config: DispatchConfig,
}

pub fn mode_from_wire(m: i32) -> Result<Mode, CoordError> {
    match pb::ProcessingMode::try_from(m) {
        Ok(pb::ProcessingMode::Off) => Ok(Mode::Off),
        Ok(pb::ProcessingMode::Dynamic) => Ok(Mode::Dynamic),
        Ok(pb::ProcessingMode::File) => Ok(Mode::File),
        Ok(pb::ProcessingMode::Data) => Ok(Mode::Data),
        Err(_) => Err(CoordError::InvalidArgument(format!(
            "processing mode {m} is not one of OFF (0), DYNAMIC (1), FILE (2), DATA (3)"
        ))),
    }
}

pub fn mode_to_wire(m: Mode) -> pb::ProcessingMode {
    match m {
        Mode::Off => pb::ProcessingMode::Off,
        Mode::Dynamic => pb::ProcessingMode::Dynamic,
        Mode::File => pb::ProcessingMode::File,
        Mode::Data => pb::ProcessingMode::Data,
    }
}

fn unexpected(what: &str, out: &Output) -> CoordError {
    CoordError::Internal(format!("{what} returned {out:?}"))
}

impl DispatchCore {
    async fn commit(
        &self,
        request: Option<RequestId>,
        op: DispatchOp,
    ) -> Result<DispatchOutput, CoordError> {
        let what = op.to_string();
        let result = self
            .proposer
            .propose(Command {
                request,
                op: Op::Dispatch(op),
            })
            .await?;
        match result? {
            Output::Dispatch(o) => Ok(o),
            other => Err(unexpected(&what, &other)),
        }
    }

    /// Reads the dispatcher's applied state after a linearizable read barrier.
    async fn read<T>(&self, f: impl FnOnce(&DispatcherState) -> T) -> Result<T, CoordError> {
        self.read_index.linearize().await?;
        Ok(self.reader.read(|a| f(&a.state.dispatcher)))
    }

    pub async fn register_dataset(
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
        let op = DispatchOp::RegisterDataset {
            fingerprint: fp,
            def: Bytes::from(def.encode_to_vec()),
            total_splits: plan.total_splits(),
        };
        match self.commit(id, op).await? {
            DispatchOutput::Dataset { id, created } => Ok(pb::GetOrRegisterDatasetResponse {
                dataset_id: id,
                fingerprint: fp,
                created,
            }),
            other => Err(unexpected("register_dataset", &Output::Dispatch(other))),
        }
    }

    pub async fn dataset_def(&self, dataset: u64) -> Result<pb::DatasetDef, CoordError> {
        let bytes = self
            .read(|s| s.datasets.get(&dataset).map(|d| d.def.clone()))
            .await?
            .ok_or_else(|| not_found("dataset", dataset))?;
        pb::DatasetDef::decode(bytes).map_err(|e| {
            CoordError::Internal(format!("stored dataset {dataset} does not decode: {e}"))
        })
    }

    pub async fn get_or_create_job(
        &self,
        id: Option<RequestId>,
        req: pb::GetOrCreateJobRequest,
    ) -> Result<pb::GetOrCreateJobResponse, CoordError> {
        let mode = mode_from_wire(req.mode)?;
        if req.job_name.as_deref() == Some("") {
            return Err(CoordError::InvalidArgument(
                "job_name must not be empty (leave it out for an anonymous job)".into(),
            ));
        }
        let op = DispatchOp::GetOrCreateJob {
            dataset: req.dataset_id,
            mode,
            name: req.job_name,
            num_consumers: req.num_consumers,
        };
        match self.commit(id, op).await? {
            DispatchOutput::Job { job, client } => {
                self.memory.client_heard(client);
                Ok(pb::GetOrCreateJobResponse {
                    job_id: job,
                    client_id: client,
                })
            }
            other => Err(unexpected("get_or_create_job", &Output::Dispatch(other))),
        }
    }

    pub async fn release_client(
        &self,
        id: Option<RequestId>,
        client: u64,
    ) -> Result<(), CoordError> {
        self.commit(id, DispatchOp::ReleaseClient { client })
            .await?;
        self.memory.forget_client(client);
        Ok(())
    }

    pub async fn client_heartbeat(
        &self,
        id: Option<RequestId>,
        req: pb::ClientHeartbeatRequest,
    ) -> Result<pb::ClientHeartbeatResponse, CoordError> {
        let client = req.client_id;
        let (job_id, round_robin, pending) = self
            .read(|s| {
                let job = s.clients.get(&client).and_then(|j| s.jobs.get(j))?;
                Some((job.id, job.num_consumers.is_some(), !job.pending.is_empty()))
            })
            .await?
            .ok_or_else(|| not_found("job client", client))?;
        self.memory.client_heard(client);
        if let Some(r) = req.current_round {
            self.memory.round_reported(job_id, r);
        }
        let block_round = if round_robin && pending {
            let op = DispatchOp::ClientRounds {
                client,
                current_round: req.current_round,
                blocked_round: req.blocked_round,
            };
            match self.commit(id, op).await? {
                DispatchOutput::Block(b) => b,
                other => return Err(unexpected("client_rounds", &Output::Dispatch(other))),
            }
        } else {
            None
        };
        let (tasks, job_finished) = self.reader.read(|a| {
            let s = &a.state.dispatcher;
            match s.jobs.get(&job_id) {
                None => (Vec::new(), true),
                Some(job) => (task_infos(s, job), job.finished),
            }
        });
        Ok(pb::ClientHeartbeatResponse {
            job_id,
            tasks,
            block_round,
            job_finished,
        })
    }

    pub async fn worker_heartbeat(
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
        let known = self
            .read(|s| s.workers.get(&address).filter(|w| w.alive).map(|w| w.id))
            .await?;
        let worker_id = match known {
            Some(w) => w,
            None => {
                let rounds = self.memory.rounds();
                let op = DispatchOp::RegisterWorker {
                    address: address.clone(),
                    rounds,
                };
                match self.commit(id, op).await? {
                    DispatchOutput::Worker { id } => {
                        tracing::info!(worker = %address, id, "data worker registered");
                        id
                    }
                    other => return Err(unexpected("register_worker", &Output::Dispatch(other))),
                }
            }
        };
        self.memory.worker_heard(&address, worker_id);
        let current: std::collections::HashSet<u64> = req.current_tasks.iter().copied().collect();
        Ok(self.reader.read(|a| {
            let s = &a.state.dispatcher;
            let mut new_tasks = Vec::new();
            for t in s.tasks.values() {
                if t.worker == address
                    && t.worker_id == worker_id
                    && !t.removed
                    && !t.finished
                    && !current.contains(&t.id)
                {
                    if let Some(def) = task_def(s, t) {
                        new_tasks.push(def);
                    }
                }
            }
            let tasks_to_delete = req
                .current_tasks
                .iter()
                .copied()
                .filter(|t| {
                    s.tasks
                        .get(t)
                        .is_none_or(|t| t.removed || t.worker_id != worker_id)
                })
                .collect();
            pb::WorkerHeartbeatResponse {
                new_tasks,
                tasks_to_delete,
                worker_id,
            }
        }))
    }

    pub async fn worker_update(
        &self,
        id: Option<RequestId>,
        req: pb::WorkerUpdateRequest,
    ) -> Result<(), CoordError> {
        let op = DispatchOp::WorkerUpdate {
            address: req.worker_address,
            done: req
                .splits_done
                .iter()
                .map(|d| (d.task_id, d.split))
                .collect(),
            completed: req.tasks_completed,
        };
        self.commit(id, op).await?;
        Ok(())
    }

    pub async fn get_split(
        &self,
        id: Option<RequestId>,
        req: pb::GetSplitRequest,
    ) -> Result<pb::GetSplitResponse, CoordError> {
        let op = DispatchOp::GetSplit {
            task: req.task_id,
            done: req.splits_done,
            max: req.max_splits.clamp(1, MAX_SPLITS_PER_LEASE),
        };
        match self.commit(id, op).await? {
            DispatchOutput::Split(a) => Ok(match a {
                SplitAnswer::Splits(splits) => pb::GetSplitResponse {
                    splits,
                    ..Default::default()
                },
                SplitAnswer::Retry => pb::GetSplitResponse {
                    retry: true,
                    ..Default::default()
                },
                SplitAnswer::EndOfSplits => pb::GetSplitResponse {
                    end_of_splits: true,
                    ..Default::default()
                },
            }),
            other => Err(unexpected("get_split", &Output::Dispatch(other))),
        }
    }

    pub async fn workers(&self) -> Result<pb::GetWorkersResponse, CoordError> {
        let rows = self
            .read(|s| {
                s.workers
                    .iter()
                    .map(|(address, w)| {
                        let tasks = s
                            .tasks
                            .values()
                            .filter(|t| &t.worker == address && t.worker_id == w.id && !t.removed)
                            .count() as u64;
                        (address.clone(), w.id, w.alive, tasks)
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
        Ok(pb::GetWorkersResponse {
            workers: rows
                .into_iter()
                .map(|(address, worker_id, alive, tasks)| pb::WorkerInfo {
                    millis_since_heartbeat: self.memory.worker_silence_ms(&address, worker_id),
                    address,
                    worker_id,
                    alive,
                    tasks,
                })
                .collect(),
            tf_workers: Vec::new(),
        })
    }

    pub async fn jobs(&self) -> Result<pb::ListJobsResponse, CoordError> {
        self.read(|s| pb::ListJobsResponse {
            jobs: s.jobs.values().map(|j| job_info(s, j)).collect(),
            applied_updates: s.updates,
            ..Default::default()
        })
        .await
    }
}

pub fn not_found(what: &str, id: u64) -> CoordError {
    CoordError::status(
        coord_raft_store::state::Code::NotFound,
        format!("{what} {id} is not known to the dispatcher"),
    )
}

fn task_infos(s: &DispatcherState, job: &Job) -> Vec<pb::TaskInfo> {
    s.visible_tasks(job)
        .map(|t| pb::TaskInfo {
            task_id: t.id,
            worker_address: t.worker.clone(),
            starting_round: t.starting_round.unwrap_or(0),
        })
        .collect()
}

fn task_def(s: &DispatcherState, t: &coord_raft_store::dispatcher::Task) -> Option<pb::TaskDef> {
    let job = s.jobs.get(&t.job)?;
    let ds = s.datasets.get(&job.dataset)?;
    Some(pb::TaskDef {
        task_id: t.id,
        job_id: job.id,
        dataset_id: job.dataset,
        dataset: pb::DatasetDef::decode(ds.def.clone()).ok(),
        mode: mode_to_wire(job.mode) as i32,
        shard_index: t.shard_index,
        num_shards: job.num_shards,
        num_consumers: job.num_consumers,
    })
}

pub fn job_info(s: &DispatcherState, j: &Job) -> pb::JobInfo {
    pb::JobInfo {
        job_id: j.id,
        job_name: j.name.clone(),
        dataset_id: j.dataset,
        mode: mode_to_wire(j.mode) as i32,
        num_consumers: j.num_consumers,
        clients: j.clients.len() as u64,
        tasks: s.visible_tasks(j).count() as u64,
        finished: j.finished,
        next_split: j.splits.next,
        leased_splits: j.splits.leased.len() as u64,
        reissue_splits: j.splits.reissue.len() as u64,
        total_splits: j.splits.total.unwrap_or(0),
        pending_tasks: j.pending.len() as u64,
        delivered_splits: j.splits.delivered,
        reissued_splits: j.splits.reissued,
    }
}

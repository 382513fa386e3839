//! What TensorFlow's workers and clients are told of tasks, built from the replicated state:
//! a worker's `TaskDef` (TF's `PopulateTaskDef`) and a client's `TaskInfo`.

use bytes::Bytes;
use coord_proto::tensorflow::data::{
    self as pb, task_def, DataTransferServerInfo, ProcessingModeDef,
};
use coord_raft_store::dispatcher::{sharding, DatasetSource, DispatcherState, Iteration, Task};
use prost::Message;

use crate::error::CoordError;

fn decode<M: Message + Default>(what: &str, bytes: &Bytes) -> Result<M, CoordError> {
    M::decode(bytes.clone())
        .map_err(|e| CoordError::Internal(format!("stored {what} does not decode: {e}")))
}

/// The `TaskDef` of `task` for its worker: the dataset's graph inline, its processing mode, and
/// what its mode needs (split providers, worker index, consumers).
pub fn task_def(s: &DispatcherState, task: &Task) -> Result<pb::TaskDef, CoordError> {
    let missing = |what: &str| CoordError::Internal(format!("task {} has no {what}", task.id));
    let it = s
        .iterations
        .get(&task.iteration)
        .ok_or_else(|| missing("iteration"))?;
    let job = s.jobs.get(&it.job).ok_or_else(|| missing("job"))?;
    let dataset = s
        .datasets
        .get(&job.dataset)
        .ok_or_else(|| missing("dataset"))?;
    let (num_workers, worker_index) = if sharding::is_static(job.sharding) {
        let index = s
            .workers
            .get(&task.worker)
            .and_then(|w| w.index)
            .ok_or_else(|| {
                CoordError::status(
                    coord_raft_store::state::Code::NotFound,
                    format!(
                        "Failed to shard dataset in tf.data service: Worker {} is not in the \
                         workers list (start the coordinators with --tfdata-worker-addresses \
                         listing every worker)",
                        task.worker
                    ),
                )
            })?;
        (index.of, index.index)
    } else {
        (0, 0)
    };
    let DatasetSource::Graph(graph) = &dataset.source else {
        return Err(missing("graph"));
    };
    Ok(pb::TaskDef {
        dataset: Some(task_def::Dataset::DatasetDef(decode(
            "dataset definition",
            graph,
        )?)),
        dataset_id: job.dataset.clone(),
        task_id: task.id,
        iteration_id: it.id,
        num_split_providers: it
            .providers
            .as_ref()
            .map_or(0, |p| i64::try_from(p.len()).unwrap_or(i64::MAX)),
        worker_address: task.worker.clone(),
        processing_mode_def: Some(ProcessingModeDef {
            sharding_policy: job.sharding,
        }),
        optional_num_consumers: job
            .num_consumers
            .map(task_def::OptionalNumConsumers::NumConsumers),
        num_workers,
        worker_index,
        use_cross_trainer_cache: job.cross_trainer_cache,
    })
}

/// The tasks of `it` as its clients read them.
pub fn task_infos(s: &DispatcherState, it: &Iteration) -> Result<Vec<pb::TaskInfo>, CoordError> {
    s.iteration_tasks(it)
        .map(|t| {
            let w = s.workers.get(&t.worker);
            Ok(pb::TaskInfo {
                worker_address: t.worker.clone(),
                transfer_servers: transfer_servers(w.map_or(&[][..], |w| &w.transfer_servers))?,
                worker_tags: w.map(|w| w.tags.clone()).unwrap_or_default(),
                task_id: t.id,
                iteration_id: it.id,
                worker_uid: w.map_or(0, |w| w.uid),
                starting_round: t.starting_round,
            })
        })
        .collect()
}

pub fn transfer_servers(stored: &[Bytes]) -> Result<Vec<DataTransferServerInfo>, CoordError> {
    stored
        .iter()
        .map(|b| decode("transfer server", b))
        .collect()
}

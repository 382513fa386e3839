//! TensorFlow's tf.data state as operators read it (`coordctl dispatcher jobs|workers`, beside
//! coord's own dispatcher): one row per iteration, one per worker.

use coord_proto::coord::dispatcher as pb;
use coord_raft_store::tfdata::{sharding, TfDataState};

use super::TfDataCore;
use crate::error::CoordError;

impl TfDataCore {
    /// Every iteration, and how many updates were applied.
    pub async fn iteration_rows(&self) -> Result<(Vec<pb::TfIterationInfo>, u64), CoordError> {
        self.read(|s| {
            (
                s.iterations.values().map(|it| row(s, it)).collect(),
                s.updates,
            )
        })
        .await
    }

    pub async fn worker_rows(&self) -> Result<Vec<pb::TfWorkerInfo>, CoordError> {
        let rows = self
            .read(|s| {
                s.workers
                    .iter()
                    .map(|(address, w)| pb::TfWorkerInfo {
                        address: address.clone(),
                        tasks: w.tasks.len() as u64,
                        worker_index: w.index.map(|i| i.index),
                        millis_since_heartbeat: None,
                        tags: w.tags.clone(),
                    })
                    .collect::<Vec<_>>()
            })
            .await?;
        Ok(rows
            .into_iter()
            .map(|mut r| {
                r.millis_since_heartbeat = self.memory.worker_silence_ms(&r.address);
                r
            })
            .collect())
    }
}

fn row(s: &TfDataState, it: &coord_raft_store::tfdata::Iteration) -> pb::TfIterationInfo {
    let job = s.jobs.get(&it.job);
    pb::TfIterationInfo {
        iteration_id: it.id,
        job_id: it.job,
        job_name: job.map(|j| j.name.clone()).unwrap_or_default(),
        dataset_id: job.map(|j| j.dataset.clone()).unwrap_or_default(),
        processing_mode: sharding::name(job.map_or(-1, |j| j.sharding)).to_string(),
        repetition: it.repetition,
        num_consumers: job.and_then(|j| j.num_consumers),
        clients: it.num_clients,
        tasks: it.tasks.len() as u64,
        pending_tasks: it.pending.len() as u64,
        splits: it
            .providers
            .iter()
            .flatten()
            .map(|p| pb::TfSplitPosition {
                repetition: p.repetition,
                index: p.index,
                splits: p.splits,
            })
            .collect(),
        finished: it.finished,
        garbage_collected: it.garbage_collected,
    }
}

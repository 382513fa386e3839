//! The dispatcher as operators read it (`coordctl dispatcher jobs|workers`, `ListJobs`,
//! `GetWorkers`): coord's jobs and data workers in coord's terms (u64 ids, leases), TensorFlow's
//! iterations and workers in TensorFlow's, from the one state.

use coord_proto::coord::dispatcher as pb;
use coord_raft_store::dispatcher::{sharding, DispatcherState, Iteration, ENDLESS};

use super::DispatcherCore;
use crate::error::CoordError;

impl DispatcherCore {
    /// Every job and iteration, and how many updates were applied.
    pub async fn job_rows(&self) -> Result<pb::ListJobsResponse, CoordError> {
        self.read(|s| {
            let (coord, tf): (Vec<&Iteration>, Vec<&Iteration>) =
                s.iterations.values().partition(|it| s.reads_definition(it));
            pb::ListJobsResponse {
                jobs: coord.into_iter().map(|it| job_info(s, it)).collect(),
                applied_updates: s.updates,
                tf_iterations: tf.into_iter().map(|it| iteration_row(s, it)).collect(),
                tf_applied_updates: 0,
            }
        })
        .await
    }

    pub async fn worker_rows(&self) -> Result<pb::GetWorkersResponse, CoordError> {
        let mut reply = self
            .read(|s| {
                let mut reply = pb::GetWorkersResponse::default();
                for (address, w) in &s.workers {
                    if w.reports_delivery {
                        reply.workers.push(pb::WorkerInfo {
                            address: address.clone(),
                            worker_id: w.registration,
                            alive: !w.lost,
                            tasks: w.tasks.len() as u64,
                            millis_since_heartbeat: None,
                        });
                    } else {
                        reply.tf_workers.push(pb::TfWorkerInfo {
                            address: address.clone(),
                            tasks: w.tasks.len() as u64,
                            worker_index: w.index.map(|i| i.index),
                            millis_since_heartbeat: None,
                            tags: w.tags.clone(),
                        });
                    }
                }
                reply
            })
            .await?;
        for w in &mut reply.workers {
            w.millis_since_heartbeat = self.memory().worker_silence_ms(&w.address);
        }
        for w in &mut reply.tf_workers {
            w.millis_since_heartbeat = self.memory().worker_silence_ms(&w.address);
        }
        Ok(reply)
    }
}

/// A coord job (an iteration of a definition) in coord's terms.
pub fn job_info(s: &DispatcherState, it: &Iteration) -> pb::JobInfo {
    let job = s.jobs.get(&it.job);
    let provider = it.providers.as_ref().and_then(|p| p.first());
    let leases = provider.and_then(|p| p.leases.as_ref());
    pb::JobInfo {
        job_id: u64::try_from(it.id).unwrap_or(0),
        job_name: job.filter(|j| !j.anonymous).map(|j| j.name.clone()),
        dataset_id: job.and_then(|j| j.dataset.parse().ok()).unwrap_or(0),
        mode: job.map_or(0, |j| j.sharding),
        num_consumers: job
            .and_then(|j| j.num_consumers)
            .and_then(|n| u64::try_from(n).ok()),
        clients: u64::try_from(it.num_clients).unwrap_or(0),
        tasks: s.iteration_tasks(it).count() as u64,
        finished: it.finished,
        next_split: provider.map_or(0, |p| p.index),
        leased_splits: leases.map_or(0, |l| l.leased.len() as u64),
        reissue_splits: leases.map_or(0, |l| l.reissue.len() as u64),
        total_splits: provider.map_or(0, |p| if p.splits == ENDLESS { 0 } else { p.splits }),
        pending_tasks: it.pending.len() as u64,
        delivered_splits: leases.map_or(0, |l| l.delivered),
        reissued_splits: leases.map_or(0, |l| l.reissued),
    }
}

/// A TensorFlow iteration in TensorFlow's terms.
fn iteration_row(s: &DispatcherState, it: &Iteration) -> pb::TfIterationInfo {
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

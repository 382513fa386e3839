//! The two dispatcher states of before, read into the one of today.
//!
//! Until snapshot format 5 the ensemble kept two dispatchers side by side: coord's own
//! ([`coord`]) and TensorFlow's ([`tf`]). A data directory written then holds them in its
//! snapshot, and its log may hold updates of coord's (`Op::LegacyDispatch`; TensorFlow's updates
//! are today's first twelve ops, unchanged). [`convert`] turns the two states into one;
//! [`DispatcherState::apply_legacy`] applies one of those updates to it. Nothing proposes them
//! any more.
//!
//! Ids are what clients hold, so coord's keep theirs: a dataset `7` is dataset `"7"`, a job `9`
//! is iteration `9` (coord's job id is its iteration's), tasks and clients keep their numbers,
//! and a worker's id becomes its registration. An id that a TensorFlow object of the same kind
//! already holds (possible once coord's shared counter passed TensorFlow's bases) is given a
//! fresh one, noted in [`LegacyIds::remap`], and the updates replayed from the log are
//! translated through it. A job name both held is given to TensorFlow's job; coord's is renamed
//! `<name> (coord job <id>)`.

pub mod coord;
pub mod tf;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::ids::Kind;
use super::{
    Dataset, DatasetSource, DispatcherOp, DispatcherResult, DispatcherState, Iteration, Job,
    Leases, LegacyIds, PendingTask, Provider, Task, Worker, ENDLESS,
};

/// The one state of today holding everything the two of before held.
pub fn convert(coord: coord::DispatcherState, tf: tf::TfDataState) -> DispatcherState {
    let mut s = from_tf(tf);
    if coord == coord::DispatcherState::default() {
        return s;
    }
    let mut legacy = LegacyIds {
        last_id: coord.last_id,
        remap: BTreeMap::new(),
    };
    let mut keep = |s: &mut DispatcherState, kind: Kind, old: u64| -> i64 {
        match i64::try_from(old) {
            Ok(id) if !s.taken(kind, id) => id,
            _ => {
                let id = s.fresh_id(kind);
                legacy.remap.insert(old, id);
                id
            }
        }
    };
    let datasets: BTreeMap<u64, String> = coord
        .datasets
        .keys()
        .map(|d| (*d, keep(&mut s, Kind::Dataset, *d).to_string()))
        .collect();
    let iterations: BTreeMap<u64, i64> = coord
        .jobs
        .keys()
        .map(|j| (*j, keep(&mut s, Kind::Iteration, *j)))
        .collect();
    let tasks: BTreeMap<u64, i64> = coord
        .tasks
        .keys()
        .map(|t| (*t, keep(&mut s, Kind::Task, *t)))
        .collect();
    let clients: BTreeMap<u64, i64> = coord
        .clients
        .keys()
        .map(|c| (*c, keep(&mut s, Kind::Client, *c)))
        .collect();
    let task = |t: &u64| tasks.get(t).copied().unwrap_or(-1);
    let client = |c: &u64| clients.get(c).copied().unwrap_or(-1);

    for (old, d) in coord.datasets {
        let id = datasets[&old].clone();
        s.by_fingerprint.insert(d.fingerprint, id.clone());
        s.datasets.insert(
            id,
            Dataset {
                source: DatasetSource::Definition {
                    fingerprint: d.fingerprint,
                    def: d.def,
                    total_splits: d.total_splits,
                },
                metadata: Bytes::new(),
                compression: 0,
                compression_disabled: None,
            },
        );
    }
    for (address, w) in &coord.workers {
        s.next.registration = s.next.registration.max(w.id + 1);
        if s.workers.contains_key(address) {
            continue;
        }
        let live: BTreeSet<i64> = coord
            .tasks
            .values()
            .filter(|t| &t.worker == address && t.worker_id == w.id)
            .filter(|t| !t.finished && !t.removed)
            .map(|t| task(&t.id))
            .collect();
        s.workers.insert(
            address.clone(),
            Worker {
                transfer_servers: Vec::new(),
                tags: Vec::new(),
                uid: 0,
                index: None,
                tasks: live,
                lost: !w.alive,
                reports_delivery: true,
                registration: w.id,
            },
        );
    }
    for (old, j) in coord.jobs {
        let id = iterations[&old];
        let mut name = j.name.clone();
        if let Some(n) = name.as_ref().filter(|n| s.jobs_by_name.contains_key(*n)) {
            name = Some(format!("{n} (coord job {id})"));
        }
        let job = s.new_job(
            name.as_deref(),
            0,
            Job {
                id: 0,
                name: String::new(),
                anonymous: true,
                dataset: datasets.get(&j.dataset).cloned().unwrap_or_default(),
                sharding: j.mode.sharding(),
                num_consumers: j
                    .num_consumers
                    .map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
                target_workers: 0,
                cross_trainer_cache: false,
            },
        );
        let providers = (j.mode == coord::Mode::Dynamic).then(|| {
            vec![Provider {
                spec: Bytes::new(),
                splits: j.splits.total.unwrap_or(ENDLESS),
                repetition: 0,
                index: j.splits.next,
                leases: Some(Leases {
                    leased: j.splits.leased.iter().map(|(s, t)| (*s, task(t))).collect(),
                    reissue: j.splits.reissue.clone(),
                    delivered: j.splits.delivered,
                    reissued: j.splits.reissued,
                }),
            }]
        });
        let pending_tasks: BTreeSet<u64> = j.pending.iter().map(|p| p.task).collect();
        let name = s.jobs.get(&job).map(|j| j.name.clone()).unwrap_or_default();
        s.iterations_by_key.insert((name, 0), id);
        s.iterations.insert(
            id,
            Iteration {
                id,
                job,
                repetition: 0,
                providers,
                tasks: j
                    .tasks
                    .iter()
                    .filter(|t| !pending_tasks.contains(t))
                    .map(task)
                    .collect(),
                pending: j
                    .pending
                    .iter()
                    .map(|p| PendingTask {
                        task: task(&p.task),
                        target_round: p.target_round,
                        ready: p.ready.iter().map(client).collect(),
                        failures: p.delta.max(1).trailing_zeros(),
                    })
                    .collect(),
                num_clients: j.clients.len() as i64,
                last_client_released_micros: j
                    .idle_since_ms
                    .map_or(-1, |ms| micros(ms).unwrap_or(i64::MAX)),
                num_shards: j.num_shards,
                finished: j.finished,
                garbage_collected: j.garbage_collected,
            },
        );
        s.splits_handed_out += if j.mode == coord::Mode::Dynamic {
            j.splits.next
        } else {
            0
        };
    }
    for (old, t) in coord.tasks {
        let pending = t.starting_round.is_none();
        let iteration = iterations.get(&t.job).copied().unwrap_or(-1);
        let target = s
            .iterations
            .get(&iteration)
            .and_then(|it| it.pending.iter().find(|p| p.task == task(&old)))
            .map(|p| p.target_round);
        s.tasks.insert(
            task(&old),
            Task {
                id: task(&old),
                iteration,
                worker: t.worker,
                registration: t.worker_id,
                starting_round: match (pending, target) {
                    (true, Some(r)) => r,
                    _ => t.starting_round.unwrap_or(0),
                },
                shard_index: t.shard_index,
                finished: t.finished,
                removed: t.removed,
            },
        );
    }
    for (c, job) in coord.clients {
        s.clients
            .insert(client(&c), iterations.get(&job).copied().unwrap_or(-1));
    }
    s.updates += coord.updates;
    s.legacy = Some(legacy);
    s
}

/// Milliseconds of the leader's clock as microseconds.
fn micros(ms: u64) -> Option<i64> {
    i64::try_from(ms).ok()?.checked_mul(1000)
}

fn from_tf(tf: tf::TfDataState) -> DispatcherState {
    let mut s = DispatcherState::default();
    let mut registrations = BTreeMap::new();
    for (address, w) in tf.workers {
        let registration = s.new_registration();
        registrations.insert(address.clone(), registration);
        s.workers.insert(
            address,
            Worker {
                transfer_servers: w.transfer_servers,
                tags: w.tags,
                uid: w.uid,
                index: w.index,
                tasks: w.tasks,
                lost: w.lost,
                reports_delivery: false,
                registration,
            },
        );
    }
    s.datasets = tf
        .datasets
        .into_iter()
        .map(|(id, d)| {
            (
                id,
                Dataset {
                    source: DatasetSource::Graph(d.def),
                    metadata: d.metadata,
                    compression: d.compression,
                    compression_disabled: d.compression_disabled,
                },
            )
        })
        .collect();
    s.jobs = tf
        .jobs
        .into_iter()
        .map(|(id, j)| {
            let anonymous = j.name.starts_with(&format!("anonymous_job_{id}_"));
            (
                id,
                Job {
                    id: j.id,
                    name: j.name,
                    anonymous,
                    dataset: j.dataset,
                    sharding: j.sharding,
                    num_consumers: j.num_consumers,
                    target_workers: j.target_workers,
                    cross_trainer_cache: j.cross_trainer_cache,
                },
            )
        })
        .collect();
    s.jobs_by_name = tf.jobs_by_name;
    s.iterations = tf
        .iterations
        .into_iter()
        .map(|(id, it)| {
            let providers = it.providers.map(|ps| {
                ps.into_iter()
                    .map(|p| Provider {
                        spec: p.spec,
                        splits: p.splits,
                        repetition: p.repetition,
                        index: p.index,
                        leases: None,
                    })
                    .collect()
            });
            (
                id,
                Iteration {
                    id: it.id,
                    job: it.job,
                    repetition: it.repetition,
                    providers,
                    tasks: it.tasks,
                    pending: it.pending,
                    num_clients: it.num_clients,
                    last_client_released_micros: it.last_client_released_micros,
                    num_shards: 0,
                    finished: it.finished,
                    garbage_collected: it.garbage_collected,
                },
            )
        })
        .collect();
    s.iterations_by_key = tf.iterations_by_key;
    s.tasks = tf
        .tasks
        .into_iter()
        .map(|(id, t)| {
            let registration = registrations.get(&t.worker).copied().unwrap_or(0);
            (
                id,
                Task {
                    id: t.id,
                    iteration: t.iteration,
                    worker: t.worker,
                    registration,
                    starting_round: t.starting_round,
                    shard_index: 0,
                    finished: t.finished,
                    removed: false,
                },
            )
        })
        .collect();
    s.clients = tf.clients;
    s.next.dataset = tf.next.dataset;
    s.next.iteration = tf.next.iteration;
    s.next.client = tf.next.client;
    s.next.task = tf.next.task;
    s.next.job = tf.next.job;
    s.updates = tf.updates;
    s.splits_handed_out = tf.splits_handed_out;
    s
}

impl DispatcherState {
    /// Applies an update of coord's dispatcher of before (from a log written then) as today's
    /// op, its ids translated and its new objects numbered as that dispatcher numbered them.
    pub fn apply_legacy(&mut self, op: &coord::DispatchOp, now_ms: u64) -> DispatcherResult {
        use coord::DispatchOp as Old;
        let id = |s: &Self, old: &u64| s.legacy_id(*old);
        let today = match op {
            Old::RegisterDataset {
                fingerprint,
                def,
                total_splits,
            } => DispatcherOp::RegisterDefinition {
                fingerprint: *fingerprint,
                def: def.clone(),
                total_splits: *total_splits,
            },
            Old::GetOrCreateJob {
                dataset,
                mode,
                name,
                num_consumers,
            } => DispatcherOp::JoinJob {
                dataset: id(self, dataset).to_string(),
                sharding: mode.sharding(),
                name: name.clone(),
                anonymous_tag: 0,
                num_consumers: num_consumers.map(|n| i64::try_from(n).unwrap_or(i64::MAX)),
            },
            Old::ReleaseClient { client } | Old::ClientTimeout { client } => {
                DispatcherOp::ReleaseClient {
                    client: id(self, client),
                    time_micros: micros(now_ms).unwrap_or(i64::MAX),
                }
            }
            Old::RegisterWorker { address, rounds } => DispatcherOp::RegisterDataWorker {
                address: address.clone(),
                rounds: rounds.iter().map(|(j, r)| (id(self, j), *r)).collect(),
            },
            Old::WorkerTimeout { address, worker_id } => DispatcherOp::DataWorkerTimeout {
                address: address.clone(),
                registration: *worker_id,
            },
            Old::GetSplit { task, done, max } => DispatcherOp::LeaseSplits {
                task: id(self, task),
                done: done.clone(),
                max: *max,
            },
            Old::WorkerUpdate {
                address,
                done,
                completed,
            } => DispatcherOp::ReportDelivery {
                address: address.clone(),
                done: done.iter().map(|(t, s)| (id(self, t), *s)).collect(),
                completed: completed.iter().map(|t| id(self, t)).collect(),
            },
            Old::ClientRounds {
                client,
                current_round,
                blocked_round,
            } => DispatcherOp::ClientHeartbeat {
                client: id(self, client),
                current_round: *current_round,
                blocked_round: *blocked_round,
                client_round: current_round.unwrap_or(0),
            },
            Old::CollectJob { job } => DispatcherOp::CollectJob {
                iteration: id(self, job),
            },
        };
        self.replaying(|s| s.apply(&today))
    }
}

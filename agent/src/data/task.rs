//! One task on a data worker: a producer fills a bounded queue with the elements of the task's
//! splits (handed out by the dispatcher under DYNAMIC sharding, computed locally otherwise), and
//! consumers take them with GetElement.
//!
//! A split is *delivered* once its last element left in a response; delivered splits are reported
//! to the dispatcher (piggybacked on the next GetSplit or sent with the next heartbeat) so their
//! leases end. Round-robin tasks hand out rounds: round `r` is the next `num_consumers` elements,
//! slot `c` for consumer `c`, and asking again for the same slot gets the same element.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use coord_proto::coord::dispatcher as pb;
use coord_proto::dataset::{Element, FileCache, Plan};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tonic::Status;

use super::dispatcher::DispatchClient;

/// Elements a task keeps ready ahead of its consumers.
const QUEUE_CAPACITY: usize = 256;
/// How long a task waits before asking again when the dispatcher says "retry".
const SPLIT_RETRY: Duration = Duration::from_millis(20);
/// GetSplits a DYNAMIC task keeps in flight: the dispatcher batches concurrent ones into one Raft
/// entry, so a few per worker keep the log busy without one split per round trip.
const SPLIT_PREFETCH: usize = 4;
/// Splits one GetSplit leases: one journal update and one round trip for all of them, where TF
/// pays both per split. A worker that dies loses nothing: its leased splits are re-issued.
const SPLIT_LEASE: u32 = 8;

pub struct TaskRunner {
    pub def: pb::TaskDef,
    mode: pb::ProcessingMode,
    state: Mutex<State>,
    room: Notify,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Element>,
    /// Elements of each split still in the queue.
    remaining: HashMap<u64, usize>,
    /// Splits delivered and not yet reported to the dispatcher.
    delivered: Vec<u64>,
    produced_all: bool,
    error: Option<String>,
    /// The end of the sequence was handed out; `true` in `reported` once the dispatcher knows.
    ended: bool,
    completion_reported: bool,
    stopped: bool,
    rounds: BTreeMap<i64, Round>,
    last_round: Option<i64>,
}

struct Round {
    elements: Vec<Element>,
    taken: Vec<bool>,
}

/// What a GetElement gets.
pub enum Answer {
    Element(Element),
    Retry,
    EndOfSequence,
}

impl TaskRunner {
    pub fn new(def: pb::TaskDef) -> Result<Arc<Self>, String> {
        let mode = pb::ProcessingMode::try_from(def.mode)
            .map_err(|_| format!("task {}: unknown processing mode {}", def.task_id, def.mode))?;
        Ok(Arc::new(Self {
            def,
            mode,
            state: Mutex::new(State::default()),
            room: Notify::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn stop(&self) {
        self.lock().stopped = true;
        self.room.notify_one();
    }

    /// Produces the task's elements until the last one or until stopped.
    pub async fn produce(self: Arc<Self>, dispatcher: DispatchClient) {
        if let Err(e) = self.produce_inner(&dispatcher).await {
            tracing::warn!(task = self.def.task_id, error = %e, "task failed");
            self.lock().error = Some(format!("task {} failed: {e}", self.def.task_id));
        }
    }

    async fn produce_inner(&self, dispatcher: &DispatchClient) -> Result<(), String> {
        let id = self.def.task_id;
        let dataset = self
            .def
            .dataset
            .as_ref()
            .ok_or_else(|| format!("task {id} came without its dataset"))?;
        let plan = Plan::new(dataset)?;
        let shard = (self.def.shard_index, self.def.num_shards);
        let data_shard = (self.mode == pb::ProcessingMode::Data).then_some(shard);
        let mut files = FileCache::default();
        let Some(mut local) = plan.static_splits(self.mode, shard) else {
            return self.produce_dynamic(dispatcher, &plan, &mut files).await;
        };
        loop {
            if !self.wait_for_room().await {
                return Ok(());
            }
            let Some(split) = local.next() else {
                self.lock().produced_all = true;
                return Ok(());
            };
            let elements = plan.split_elements(split, data_shard, &mut files)?;
            self.lock().queue.extend(elements);
        }
    }

    /// Waits until the queue has room; `false` if the task was stopped.
    async fn wait_for_room(&self) -> bool {
        loop {
            let notified = self.room.notified();
            {
                let s = self.lock();
                if s.stopped {
                    return false;
                }
                if s.queue.len() < QUEUE_CAPACITY {
                    return true;
                }
            }
            notified.await;
        }
    }

    /// DYNAMIC sharding: up to [`SPLIT_PREFETCH`] GetSplits in flight, each reporting the splits
    /// delivered since the last one.
    async fn produce_dynamic(
        &self,
        dispatcher: &DispatchClient,
        plan: &Plan,
        files: &mut FileCache,
    ) -> Result<(), String> {
        let id = self.def.task_id;
        let ask = |done: Vec<u64>, delay: Option<Duration>| {
            let d = dispatcher.clone();
            async move {
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
                let req = pb::GetSplitRequest {
                    task_id: id,
                    splits_done: done.clone(),
                    max_splits: SPLIT_LEASE,
                };
                d.get_split(req).await.map_err(|e| (e, done))
            }
        };
        let mut in_flight = FuturesUnordered::new();
        let mut ended = false;
        loop {
            while !ended && in_flight.len() < SPLIT_PREFETCH {
                let room = {
                    let s = self.lock();
                    if s.stopped {
                        return Ok(());
                    }
                    s.queue.len() < QUEUE_CAPACITY
                };
                if !room {
                    break;
                }
                let done = std::mem::take(&mut self.lock().delivered);
                in_flight.push(Box::pin(ask(done, None)));
            }
            if in_flight.is_empty() {
                if ended {
                    self.lock().produced_all = true;
                    return Ok(());
                }
                if !self.wait_for_room().await {
                    return Ok(());
                }
                continue;
            }
            let Some(answer) = in_flight.next().await else {
                continue;
            };
            let r = match answer {
                Ok(r) => r,
                Err((e, done)) => {
                    // Report these again later.
                    self.lock().delivered.extend(done);
                    return Err(format!("GetSplit for task {id}: {}", e.message()));
                }
            };
            if r.splits.is_empty() {
                if r.retry && !ended {
                    in_flight.push(Box::pin(ask(Vec::new(), Some(SPLIT_RETRY))));
                } else if r.end_of_splits {
                    ended = true;
                }
                continue;
            }
            for split in r.splits {
                let elements = plan.split_elements(split, None, files)?;
                let mut s = self.lock();
                if elements.is_empty() {
                    s.delivered.push(split);
                } else {
                    s.remaining.insert(split, elements.len());
                }
                s.queue.extend(elements);
            }
        }
    }

    fn take_front(&self, s: &mut State) -> Option<Element> {
        let e = s.queue.pop_front()?;
        if let Some(n) = s.remaining.get_mut(&e.split) {
            *n -= 1;
            if *n == 0 {
                s.remaining.remove(&e.split);
                s.delivered.push(e.split);
            }
        }
        self.room.notify_one();
        Some(e)
    }

    fn end_or_retry(s: &mut State) -> Result<Answer, Status> {
        if let Some(e) = &s.error {
            return Err(Status::failed_precondition(e.clone()));
        }
        if s.produced_all {
            s.ended = true;
            return Ok(Answer::EndOfSequence);
        }
        Ok(Answer::Retry)
    }

    /// The next element for any consumer (no round-robin).
    pub fn next(&self) -> Result<Answer, Status> {
        let mut s = self.lock();
        match self.take_front(&mut s) {
            Some(e) => Ok(Answer::Element(e)),
            None => Self::end_or_retry(&mut s),
        }
    }

    /// Consumer `consumer`'s element of round `round`.
    pub fn round(&self, consumer: u64, round: i64) -> Result<Answer, Status> {
        let n = self.def.num_consumers.unwrap_or(1) as usize;
        let c = consumer as usize;
        if c >= n {
            return Err(Status::invalid_argument(format!(
                "consumer_index {consumer} is out of range: task {} has {n} consumers",
                self.def.task_id
            )));
        }
        let mut s = self.lock();
        if !s.rounds.contains_key(&round) {
            if s.last_round.is_some_and(|l| round <= l) {
                return Err(Status::failed_precondition(format!(
                    "round {round} of task {} was already served to every consumer",
                    self.def.task_id
                )));
            }
            if s.queue.len() < n {
                return Self::end_or_retry(&mut s);
            }
            let elements: Vec<Element> = (0..n).filter_map(|_| self.take_front(&mut s)).collect();
            s.last_round = Some(round);
            s.rounds.insert(
                round,
                Round {
                    elements,
                    taken: vec![false; n],
                },
            );
        }
        let Some(r) = s.rounds.get_mut(&round) else {
            return Ok(Answer::Retry);
        };
        r.taken[c] = true;
        let e = r.elements[c].clone();
        if r.taken.iter().all(|t| *t) {
            s.rounds.remove(&round);
        }
        Ok(Answer::Element(e))
    }

    /// Delivered splits to report, and whether the task's completion is to be reported.
    pub fn take_report(&self) -> (Vec<u64>, bool) {
        let mut s = self.lock();
        let done = std::mem::take(&mut s.delivered);
        let complete = s.ended && !s.completion_reported && s.queue.is_empty();
        if complete {
            s.completion_reported = true;
        }
        (done, complete)
    }

    /// Puts back a report that could not be sent.
    pub fn restore_report(&self, done: Vec<u64>, complete: bool) {
        let mut s = self.lock();
        s.delivered.extend(done);
        if complete {
            s.completion_reported = false;
        }
    }
}

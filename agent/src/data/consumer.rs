//! [`Consumer`]: reads a job's elements straight from its data workers.
//!
//! A background heartbeat keeps the consumer's view of the job (its tasks, whether it finished,
//! and for round-robin reads the round it must not start yet) fresh. Without round-robin the
//! consumer takes elements from its tasks in turn until every task ended and the job finished.
//! With round-robin (consumer `c` of `n`), round `r` is read from the `r mod k`-th of the `k`
//! tasks whose starting round is at most `r`, so every consumer reads round `r` from the same
//! task. Under DYNAMIC sharding elements carry (split, offset); a consumer drops an element it
//! has seen, which turns the dispatcher's at-least-once re-issue of a dead worker's splits into
//! exactly-once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use coord_proto::coord::dispatcher as pb;
use coord_proto::coord::dispatcher::data_worker_client::DataWorkerClient;
use coord_proto::dataset::Element;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Notify;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::dispatcher::DispatchClient;

#[derive(Clone, Debug)]
pub struct ConsumerOptions {
    pub heartbeat: Duration,
    /// Drop elements already seen (by split and offset). Right for DYNAMIC sharding; under OFF
    /// every worker produces the same identities on purpose.
    pub dedupe: bool,
    /// Round-robin reads: this consumer's index.
    pub consumer_index: Option<u64>,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_secs(1),
            dedupe: false,
            consumer_index: None,
        }
    }
}

#[derive(Default)]
struct View {
    tasks: Vec<pb::TaskInfo>,
    block_round: Option<i64>,
    job_finished: bool,
    /// Round-robin: the round this consumer reads now.
    current_round: i64,
    /// Heartbeats answered so far.
    generation: u64,
    error: Option<Status>,
}

pub struct Consumer {
    dispatcher: DispatchClient,
    pub job_id: u64,
    pub client_id: u64,
    options: ConsumerOptions,
    view: Arc<Mutex<View>>,
    refreshed: Arc<Notify>,
    kick: Arc<Notify>,
    heartbeat: tokio::task::JoinHandle<()>,
    workers: HashMap<String, DataWorkerClient<Channel>>,
    ended: HashSet<u64>,
    /// Tasks that failed since this heartbeat generation (skipped until the next one).
    failing: HashMap<u64, u64>,
    seen: HashSet<(u64, u64)>,
    /// One GetElement in flight per task being read.
    in_flight: FuturesUnordered<Fetch>,
    fetching: HashSet<u64>,
    ready: VecDeque<Element>,
    /// Elements dropped as duplicates.
    pub duplicates: u64,
}

type Fetch = Pin<
    Box<
        dyn Future<
                Output = (
                    u64,
                    DataWorkerClient<Channel>,
                    Result<pb::GetElementResponse, Status>,
                ),
            > + Send,
    >,
>;

/// One GetElement of task `id`, after `delay`.
fn fetch(mut w: DataWorkerClient<Channel>, id: u64, delay: Option<Duration>) -> Fetch {
    Box::pin(async move {
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        let req = pb::GetElementRequest {
            task_id: id,
            ..Default::default()
        };
        // GetElement never waits on the worker's side (it answers "retry"), so a call this slow
        // means the worker is frozen or unreachable.
        let mut req = tonic::Request::new(req);
        req.set_timeout(Duration::from_secs(10));
        let r = w.get_element(req).await.map(|r| r.into_inner());
        (id, w, r)
    })
}

fn lock(v: &Mutex<View>) -> MutexGuard<'_, View> {
    v.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Consumer {
    /// Starts reading job `job_id` as client `client_id` (from GetOrCreateJob).
    pub async fn start(
        dispatcher: DispatchClient,
        job_id: u64,
        client_id: u64,
        options: ConsumerOptions,
    ) -> Result<Self, Status> {
        let view = Arc::new(Mutex::new(View::default()));
        let refreshed = Arc::new(Notify::new());
        let kick = Arc::new(Notify::new());
        heartbeat_once(
            &dispatcher,
            client_id,
            &view,
            options.consumer_index.is_some(),
        )
        .await?;
        let heartbeat = tokio::spawn(heartbeat_loop(
            dispatcher.clone(),
            client_id,
            view.clone(),
            refreshed.clone(),
            kick.clone(),
            options.clone(),
        ));
        Ok(Self {
            dispatcher,
            job_id,
            client_id,
            options,
            view,
            refreshed,
            kick,
            heartbeat,
            workers: HashMap::new(),
            ended: HashSet::new(),
            failing: HashMap::new(),
            seen: HashSet::new(),
            in_flight: FuturesUnordered::new(),
            fetching: HashSet::new(),
            ready: VecDeque::new(),
            duplicates: 0,
        })
    }

    /// Releases the job client.
    pub async fn release(self) -> Result<(), Status> {
        self.heartbeat.abort();
        self.dispatcher
            .release_job_client(pb::ReleaseJobClientRequest {
                client_id: self.client_id,
            })
            .await
            .map(|_| ())
    }

    async fn wait_refresh(&self, seen: u64) {
        loop {
            let notified = self.refreshed.notified();
            if lock(&self.view).generation > seen {
                return;
            }
            self.kick.notify_one();
            notified.await;
        }
    }

    fn worker(&mut self, address: &str) -> Result<DataWorkerClient<Channel>, Status> {
        if let Some(w) = self.workers.get(address) {
            return Ok(w.clone());
        }
        let ch = Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| Status::invalid_argument(format!("bad worker address {address:?}: {e}")))?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .connect_lazy();
        let w = DataWorkerClient::new(ch)
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20);
        self.workers.insert(address.to_string(), w.clone());
        Ok(w)
    }

    /// The next element, or `None` once the job is finished and every task ended.
    ///
    /// One request is in flight to every live task at once (as TF's client reads from several
    /// workers in parallel); elements are returned in the order they arrive.
    pub async fn next(&mut self) -> Result<Option<Element>, Status> {
        if let Some(c) = self.options.consumer_index {
            return self.next_round(c).await.map(Some);
        }
        loop {
            if let Some(e) = self.ready.pop_front() {
                return Ok(Some(e));
            }
            let (tasks, finished, generation) = {
                let v = lock(&self.view);
                if let Some(e) = &v.error {
                    return Err(e.clone());
                }
                (v.tasks.clone(), v.job_finished, v.generation)
            };
            for t in &tasks {
                let id = t.task_id;
                if self.ended.contains(&id)
                    || self.failing.get(&id) == Some(&generation)
                    || self.fetching.contains(&id)
                {
                    continue;
                }
                let w = self.worker(&t.worker_address)?;
                self.fetching.insert(id);
                self.in_flight.push(fetch(w, id, None));
            }
            if self.in_flight.is_empty() {
                if finished && tasks.iter().all(|t| self.ended.contains(&t.task_id)) {
                    return Ok(None);
                }
                self.wait_refresh(generation).await;
                continue;
            }
            // Wake up for a new heartbeat too: it may list a new task.
            let answer = tokio::select! {
                a = self.in_flight.next() => a,
                () = self.refreshed.notified() => continue,
            };
            let Some((id, w, answer)) = answer else {
                continue;
            };
            match answer {
                Ok(r) if r.retry => {
                    self.in_flight
                        .push(fetch(w, id, Some(Duration::from_millis(1))));
                }
                Ok(r) if r.end_of_sequence => {
                    self.fetching.remove(&id);
                    self.ended.insert(id);
                }
                Ok(r) => {
                    self.fetching.remove(&id);
                    if self.options.dedupe && !self.seen.insert((r.split, r.offset)) {
                        self.duplicates += 1;
                        continue;
                    }
                    self.ready.push_back(Element {
                        split: r.split,
                        offset: r.offset,
                        data: r.data,
                    });
                }
                // The task itself failed (a record file that does not match its definition):
                // reading on would hang, so the caller hears of it.
                Err(e) if matches!(e.code(), Code::InvalidArgument | Code::FailedPrecondition) => {
                    return Err(e)
                }
                Err(e) => {
                    tracing::debug!(task = id, error = %e.message(), "task unreadable; skipping it until the next heartbeat");
                    self.fetching.remove(&id);
                    self.failing.insert(id, generation);
                }
            }
        }
    }

    async fn next_round(&mut self, consumer: u64) -> Result<Element, Status> {
        loop {
            let (tasks, block, round, generation) = {
                let v = lock(&self.view);
                if let Some(e) = &v.error {
                    return Err(e.clone());
                }
                (
                    v.tasks.clone(),
                    v.block_round,
                    v.current_round,
                    v.generation,
                )
            };
            if block.is_some_and(|b| round >= b) {
                self.wait_refresh(generation).await;
                continue;
            }
            let mut eligible: Vec<&pb::TaskInfo> =
                tasks.iter().filter(|t| t.starting_round <= round).collect();
            eligible.sort_by_key(|t| t.task_id);
            if eligible.is_empty() {
                self.wait_refresh(generation).await;
                continue;
            }
            let t = eligible[round.rem_euclid(eligible.len() as i64) as usize];
            let mut w = self.worker(&t.worker_address)?;
            let req = pb::GetElementRequest {
                task_id: t.task_id,
                consumer_index: Some(consumer),
                round: Some(round),
            };
            match w.get_element(req).await.map(|r| r.into_inner()) {
                Ok(r) if r.retry => tokio::time::sleep(Duration::from_millis(1)).await,
                Ok(r) if r.end_of_sequence => {
                    return Err(Status::out_of_range(format!(
                    "task {} ended in round {round}; round-robin reads need an infinite dataset",
                    t.task_id
                )))
                }
                Ok(r) => {
                    lock(&self.view).current_round = round + 1;
                    return Ok(Element {
                        split: r.split,
                        offset: r.offset,
                        data: r.data,
                    });
                }
                Err(e) if e.code() == Code::InvalidArgument => return Err(e),
                Err(e) => {
                    tracing::debug!(task = t.task_id, error = %e.message(), "round-robin read failed; waiting for a heartbeat");
                    self.wait_refresh(generation).await;
                }
            }
        }
    }

    /// The round this round-robin consumer reads next.
    pub fn round(&self) -> i64 {
        lock(&self.view).current_round
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

async fn heartbeat_once(
    dispatcher: &DispatchClient,
    client_id: u64,
    view: &Mutex<View>,
    round_robin: bool,
) -> Result<(), Status> {
    let (current, blocked) = {
        let v = lock(view);
        (v.current_round, v.block_round)
    };
    let req = pb::ClientHeartbeatRequest {
        client_id,
        current_round: round_robin.then_some(current),
        blocked_round: if round_robin { blocked } else { None },
    };
    let r = dispatcher.client_heartbeat(req).await?;
    let mut v = lock(view);
    v.tasks = r.tasks;
    v.block_round = r.block_round;
    v.job_finished = r.job_finished;
    v.generation += 1;
    Ok(())
}

async fn heartbeat_loop(
    dispatcher: DispatchClient,
    client_id: u64,
    view: Arc<Mutex<View>>,
    refreshed: Arc<Notify>,
    kick: Arc<Notify>,
    options: ConsumerOptions,
) {
    let rr = options.consumer_index.is_some();
    loop {
        // Blocked before a round: heartbeat often, so the task is added quickly.
        let blocked = lock(&view).block_round.is_some();
        let wait = if blocked {
            Duration::from_millis(10)
        } else {
            options.heartbeat
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = kick.notified() => {}
        }
        match heartbeat_once(&dispatcher, client_id, &view, rr).await {
            Ok(()) => {}
            Err(e) if e.code() == Code::NotFound => {
                lock(&view).error = Some(e);
                refreshed.notify_waiters();
                return;
            }
            Err(e) => tracing::warn!(error = %e.message(), "client heartbeat failed; retrying"),
        }
        refreshed.notify_waiters();
    }
}

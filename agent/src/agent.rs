//! The coordination agent: what a training task uses to take part in the job (TensorFlow's
//! `CoordinationServiceAgent`), over a whole coord ensemble.
//!
//! State machine (as TensorFlow's, but for UNINITIALIZED: an [`Agent`] value is initialized by
//! its construction, which takes TensorFlow's `Initialize` arguments, so there is no agent to ask
//! whether it is initialized before it is):
//!
//! ```text
//!      new          connect          error
//!  ----> DISCONNECTED ----> RUNNING ----> ERROR
//!            ^                              |
//!            |______________________________|
//!                         reset
//! ```
//!
//! While RUNNING, two loops run: heartbeats (every `heartbeat_interval`; nothing acknowledged for
//! `heartbeat_timeout` means the service is lost) and an error poll (errors of other tasks that the
//! service propagates). Either one putting the agent in ERROR calls the error callback, once. The
//! loops are owned by the agent and stop when it is reset, shut down or dropped.
//!
//! Every call goes through [`CoordClient`], which follows the leader and re-drives calls across
//! leader changes with the same request id; a caller sees an error only when the whole ensemble
//! was unreachable for `unavailable_after`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coord_proto::tensorflow as tf;
use tokio::task::JoinHandle;
use tonic::{Code, Status};

use crate::client::{ClientOptions, CoordClient};
use crate::watch::{KeyChange, WatchSet};

/// How to reach the ensemble and who this task is.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// Every replica's gRPC address, in any form [`ClientOptions::endpoints`] takes.
    pub endpoints: Vec<String>,
    pub job: String,
    pub task_id: i32,
    /// Identifies this run of the task; a restarted task registers with a new one.
    pub incarnation: u64,
    pub heartbeat_interval: Duration,
    /// No heartbeat acknowledged for this long: the service is lost, the agent goes to ERROR.
    pub heartbeat_timeout: Duration,
    /// A call fails UNAVAILABLE only after no replica could serve it for this long.
    pub unavailable_after: Duration,
    /// TLS toward the replicas (see [`crate::tls`]); `None` speaks plain gRPC.
    pub tls: Option<coord_proto::tls::ClientTls>,
}

impl AgentConfig {
    /// Defaults as TensorFlow's: heartbeat every 5 s, 10 s timeout; a fresh random incarnation.
    pub fn new(endpoints: Vec<String>, job: impl Into<String>, task_id: i32) -> Self {
        Self {
            endpoints,
            job: job.into(),
            task_id,
            incarnation: rand::random::<u64>() | 1,
            heartbeat_interval: Duration::from_secs(5),
            heartbeat_timeout: Duration::from_secs(10),
            unavailable_after: Duration::from_secs(30),
            tls: None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentState {
    Disconnected,
    Running,
    Error,
}

/// Called once each time the agent enters ERROR, with the error.
pub type ErrorCallback = Arc<dyn Fn(&Status) + Send + Sync>;

/// A task's state as the service records it (GetTaskStatus).
#[derive(Clone, Debug)]
pub struct TaskStatus {
    pub state: tf::CoordinatedTaskState,
    pub incarnation: u64,
    /// The error that put the task in ERROR, if it is.
    pub error: Option<Status>,
}

/// The coordination agent. Cloning is cheap; clones share one agent.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

struct Inner {
    config: AgentConfig,
    client: CoordClient,
    task: tf::CoordinatedTask,
    on_error: ErrorCallback,
    state: Mutex<Shared>,
    watches: WatchSet,
}

struct Shared {
    state: AgentState,
    error: Option<Status>,
    service_incarnation: u64,
    devices: Option<tf::CoordinationServiceDeviceInfo>,
    /// The next instance counter per barrier id (instances finished so far).
    barrier_counters: HashMap<String, i64>,
    /// Sequence number of the last error received from the service.
    error_seq: u64,
    /// The heartbeat and error-poll loops while RUNNING.
    loops: Vec<JoinHandle<()>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for l in self
            .state
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .loops
            .drain(..)
        {
            l.abort();
        }
    }
}

fn precondition(what: &str, state: AgentState) -> Status {
    Status::failed_precondition(format!(
        "{what} needs the agent in another state; it is {state:?}"
    ))
}

impl Agent {
    /// Initializes the agent (TensorFlow's `Initialize`): DISCONNECTED, nothing sent yet.
    pub fn new(
        config: AgentConfig,
        on_error: impl Fn(&Status) + Send + Sync + 'static,
    ) -> Result<Self, Status> {
        let mut options = ClientOptions::new(config.endpoints.clone());
        options.unavailable_after = config.unavailable_after;
        options.tls = config.tls.clone();
        let client = CoordClient::new(options)?;
        let task = tf::CoordinatedTask {
            job_name: config.job.clone(),
            task_id: config.task_id,
            recoverable: false,
        };
        Ok(Self {
            inner: Arc::new(Inner {
                watches: WatchSet::new(client.clone()),
                client,
                task,
                config,
                on_error: Arc::new(on_error),
                state: Mutex::new(Shared {
                    state: AgentState::Disconnected,
                    error: None,
                    service_incarnation: 0,
                    devices: None,
                    barrier_counters: HashMap::new(),
                    error_seq: 0,
                    loops: Vec::new(),
                }),
            }),
        })
    }

    fn shared(&self) -> MutexGuard<'_, Shared> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn state(&self) -> AgentState {
        self.shared().state
    }

    /// The error that put the agent in ERROR.
    pub fn error(&self) -> Option<Status> {
        self.shared().error.clone()
    }

    /// This task as the service names it.
    pub fn task(&self) -> &tf::CoordinatedTask {
        &self.inner.task
    }

    /// The client underneath, for calls the agent does not wrap.
    pub fn client(&self) -> &CoordClient {
        &self.inner.client
    }

    /// The service's incarnation (0 before `connect`).
    pub fn service_incarnation(&self) -> u64 {
        self.shared().service_incarnation
    }

    fn require(&self, what: &str, state: AgentState) -> Result<(), Status> {
        let now = self.state();
        if now == state {
            Ok(())
        } else {
            Err(precondition(what, now))
        }
    }

    /// Puts the agent in ERROR (if it is not already) and calls the error callback.
    fn set_error(&self, error: Status) {
        let fresh = {
            let mut s = self.shared();
            if s.state == AgentState::Error {
                false
            } else {
                s.state = AgentState::Error;
                s.error = Some(error.clone());
                true
            }
        };
        if fresh {
            tracing::warn!(code = ?error.code(), message = error.message(), "coordination agent in error");
            (self.inner.on_error)(&error);
        }
    }

    /// Registers the task and starts heartbeating and listening for errors.
    pub async fn connect(&self) -> Result<(), Status> {
        self.require("connect", AgentState::Disconnected)?;
        let incarnation = match self
            .inner
            .client
            .register_task(&self.inner.task, self.inner.config.incarnation)
            .await
        {
            Ok(i) => i,
            Err(e) => {
                self.set_error(e.clone());
                return Err(e);
            }
        };
        let heartbeat = tokio::spawn(heartbeat_loop(Arc::downgrade(&self.inner)));
        let poll = tokio::spawn(error_poll_loop(Arc::downgrade(&self.inner)));
        let mut s = self.shared();
        s.service_incarnation = incarnation;
        s.state = AgentState::Running;
        s.loops = vec![heartbeat, poll];
        Ok(())
    }

    /// Sends this task's devices and waits until every task has; the cluster's devices are then
    /// available from [`Agent::cluster_device_attributes`].
    pub async fn wait_for_all_tasks(
        &self,
        devices: Option<tf::CoordinationServiceDeviceInfo>,
    ) -> Result<(), Status> {
        self.require("wait_for_all_tasks", AgentState::Running)?;
        let resp = self
            .inner
            .client
            .wait_for_all_tasks(&self.inner.task, devices)
            .await?;
        self.shared().devices = resp.cluster_device_info;
        Ok(())
    }

    /// Every task's devices, once [`Agent::wait_for_all_tasks`] returned.
    pub fn cluster_device_attributes(&self) -> Option<tf::CoordinationServiceDeviceInfo> {
        self.shared().devices.clone()
    }

    /// The service's view of a task.
    pub async fn task_status(&self, job: &str, task_id: i32) -> Result<TaskStatus, Status> {
        let t = tf::CoordinatedTask {
            job_name: job.to_string(),
            task_id,
            recoverable: false,
        };
        let resp = self.inner.client.task_states(&[t]).await?;
        let info = resp
            .tasks
            .into_iter()
            .next()
            .ok_or_else(|| Status::internal("GetTaskState returned no task"))?;
        let state = tf::CoordinatedTaskState::try_from(info.state)
            .unwrap_or(tf::CoordinatedTaskState::TaskstateUnspecified);
        Ok(TaskStatus {
            state,
            incarnation: info.incarnation,
            error: (info.error_code != 0)
                .then(|| Status::new(Code::from_i32(info.error_code), info.error_message)),
        })
    }

    /// Reports an error of this task to the service (which tells the other tasks) and puts the
    /// agent in ERROR.
    ///
    /// FAILED_PRECONDITION if the agent is already in ERROR (as TensorFlow's agent): the task has
    /// one error until it resets, so a later report must neither replace the error the callback
    /// and the other tasks were given nor reach the service a second time.
    pub async fn report_error(&self, error: &Status) -> Result<(), Status> {
        let first = {
            let s = self.shared();
            (s.state == AgentState::Error).then(|| s.error.clone())
        };
        if let Some(first) = first {
            let (code, message) = first.map_or((Code::Unknown, String::new()), |e| {
                (e.code(), e.message().to_string())
            });
            return Err(Status::failed_precondition(format!(
                "the coordination agent of task {}/{} is already in error state ({code:?}: \
                 {message}); reset it before reporting another error",
                self.inner.task.job_name, self.inner.task.task_id,
            )));
        }
        if self.state() == AgentState::Running {
            self.inner
                .client
                .report_error(&self.inner.task, error.code() as i32, error.message())
                .await?;
        }
        self.set_error(error.clone());
        Ok(())
    }

    /// Leaves ERROR: the service resets the task to DISCONNECTED, and so does the agent; `connect`
    /// may follow.
    pub async fn reset(&self) -> Result<(), Status> {
        self.require("reset", AgentState::Error)?;
        self.stop_loops();
        self.inner.client.reset_task(&self.inner.task).await?;
        let mut s = self.shared();
        s.state = AgentState::Disconnected;
        s.error = None;
        Ok(())
    }

    /// Disconnects from the service (waiting at the shutdown barrier if one is configured) and
    /// stops the agent's loops and watches.
    pub async fn shutdown(&self) -> Result<(), Status> {
        self.stop_loops();
        self.inner.watches.stop_all();
        let was = self.state();
        if was == AgentState::Running {
            self.inner.client.shutdown_task(&self.inner.task).await?;
        }
        self.shared().state = AgentState::Disconnected;
        Ok(())
    }

    fn stop_loops(&self) {
        for l in self.shared().loops.drain(..) {
            l.abort();
        }
    }

    /// The value of `key`, waiting until it exists, or until `timeout` (then DEADLINE_EXCEEDED).
    /// Dropping the future cancels the call.
    pub async fn get_key_value(
        &self,
        key: &str,
        timeout: Option<Duration>,
    ) -> Result<Bytes, Status> {
        let get = self.inner.client.get(key);
        match timeout {
            None => get.await,
            Some(t) => tokio::time::timeout(t, get).await.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "key {key:?} did not appear within {t:?}"
                )))
            }),
        }
    }

    /// Starts a blocking get in the background; `done` gets its result, exactly once: the value
    /// or error of the get, or CANCELLED if [`GetHandle::cancel`] came first (as TensorFlow's
    /// agent, whose callers release what the callback owns only once it has run).
    pub fn get_key_value_async(
        &self,
        key: &str,
        done: impl FnOnce(Result<Bytes, Status>) + Send + 'static,
    ) -> GetHandle {
        let agent = self.clone();
        let key = key.to_string();
        let cancel = Arc::new(tokio::sync::Notify::new());
        let cancelled = cancel.clone();
        let task = tokio::spawn(async move {
            let result = tokio::select! {
                r = agent.get_key_value(&key, None) => r,
                () = cancelled.notified() => Err(Status::cancelled(format!(
                    "the get of key {key:?} was cancelled"
                ))),
            };
            done(result)
        });
        GetHandle { task, cancel }
    }

    pub async fn try_get_key_value(&self, key: &str) -> Result<Option<Bytes>, Status> {
        self.inner.client.try_get(key).await
    }

    /// Inserts `key`; ALREADY_EXISTS if it is set.
    pub async fn insert_key_value(&self, key: &str, value: impl Into<Bytes>) -> Result<(), Status> {
        self.inner.client.insert(key, value, false).await
    }

    /// Sets `key`, whether or not it exists.
    pub async fn update_key_value(&self, key: &str, value: impl Into<Bytes>) -> Result<(), Status> {
        self.inner.client.insert(key, value, true).await
    }

    /// Deletes `key` and everything under `key/`.
    pub async fn delete_key_value(&self, key: &str) -> Result<(), Status> {
        self.inner.client.delete(key).await
    }

    pub async fn get_key_value_dir(&self, dir: &str) -> Result<Vec<(String, Bytes)>, Status> {
        self.inner.client.get_dir(dir).await
    }

    /// Adds `delta` to the decimal integer at `key`; returns the new value.
    pub async fn increment_key_value(&self, key: &str, delta: i64) -> Result<i64, Status> {
        self.inner.client.increment(key, delta).await
    }

    /// Waits at barrier `id` until every task of `tasks` (all tasks if empty) is there, for at most
    /// `timeout` from the first arrival. The agent numbers the uses of each id, so the same id can
    /// serve again after each use.
    pub async fn wait_at_barrier(
        &self,
        id: &str,
        timeout: Duration,
        tasks: &[tf::CoordinatedTask],
    ) -> Result<(), Status> {
        self.require("wait_at_barrier", AgentState::Running)?;
        let counter = *self.shared().barrier_counters.get(id).unwrap_or(&0);
        let result = self
            .inner
            .client
            .barrier(id, counter, timeout, tasks, &self.inner.task)
            .await;
        // Whatever the outcome, that instance is over, unless the service could not be reached.
        if !matches!(&result, Err(s) if s.code() == Code::Unavailable) {
            self.shared()
                .barrier_counters
                .insert(id.to_string(), counter + 1);
        }
        result.map(|_| ())
    }

    /// Cancels this task's current use of barrier `id`.
    pub async fn cancel_barrier(&self, id: &str) -> Result<(), Status> {
        let counter = *self.shared().barrier_counters.get(id).unwrap_or(&0);
        self.inner
            .client
            .cancel_barrier(id, counter, &self.inner.task)
            .await
    }

    /// Calls `on_change` with every change under `key` (the key and everything under `key/`), in
    /// commit order, from now on; none is lost or repeated across leader changes. An error that
    /// ends the watch (the ensemble unreachable for too long) is passed once.
    pub fn start_watch_key(
        &self,
        key: &str,
        on_change: impl Fn(Result<Vec<KeyChange>, Status>) + Send + Sync + 'static,
    ) -> Result<(), Status> {
        self.inner.watches.start(key, Arc::new(on_change))
    }

    pub fn stop_watch_key(&self, key: &str) -> Result<(), Status> {
        self.inner.watches.stop(key)
    }
}

/// A background get; dropping the handle does not cancel it, [`GetHandle::cancel`] does.
pub struct GetHandle {
    task: JoinHandle<()>,
    /// Wakes the task to answer CANCELLED. A `Notify` rather than an abort, so that the callback
    /// still runs; `notify_one` keeps the permit when the task has not polled it yet, so a cancel
    /// right after the start is not lost.
    cancel: Arc<tokio::sync::Notify>,
}

impl GetHandle {
    /// Ends the get with CANCELLED unless it has already called back (then nothing happens).
    pub fn cancel(&self) {
        self.cancel.notify_one();
    }

    /// Whether the callback has run.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

async fn heartbeat_loop(inner: std::sync::Weak<Inner>) {
    let mut last_ok = Instant::now();
    loop {
        let Some(this) = inner.upgrade().map(|inner| Agent { inner }) else {
            return;
        };
        let (interval, timeout) = (
            this.inner.config.heartbeat_interval,
            this.inner.config.heartbeat_timeout,
        );
        drop(this);
        tokio::time::sleep(interval).await;
        let Some(this) = inner.upgrade().map(|inner| Agent { inner }) else {
            return;
        };
        let left = timeout
            .saturating_sub(last_ok.elapsed())
            .max(Duration::from_millis(10));
        let beat = this
            .inner
            .client
            .heartbeat(&this.inner.task, this.inner.config.incarnation);
        match tokio::time::timeout(left, beat).await {
            Ok(Ok(_)) => last_ok = Instant::now(),
            Ok(Err(e)) => {
                this.set_error(e);
                return;
            }
            Err(_) => {
                this.set_error(Status::unavailable(format!(
                    "no heartbeat of task {}/{} was acknowledged for {timeout:?}: the coordination service is unreachable",
                    this.inner.task.job_name, this.inner.task.task_id
                )));
                return;
            }
        }
    }
}

async fn error_poll_loop(inner: std::sync::Weak<Inner>) {
    loop {
        let Some(this) = inner.upgrade().map(|inner| Agent { inner }) else {
            return;
        };
        let after = this.shared().error_seq;
        let client = this.inner.client.clone();
        let task = this.inner.task.clone();
        drop(this);
        match client.poll_for_error(&task, after).await {
            Ok(e) => {
                let Some(this) = inner.upgrade().map(|inner| Agent { inner }) else {
                    return;
                };
                this.shared().error_seq = e.seq;
                this.set_error(Status::new(Code::from_i32(e.error_code), e.error_message));
                return;
            }
            // The heartbeat loop decides when the service is lost; keep listening meanwhile.
            Err(e) => {
                tracing::debug!(error = %e, "error poll failed; polling again");
                tokio::time::sleep(crate::client::jittered(Duration::from_millis(500))).await;
            }
        }
    }
}

//! TensorFlow's `RendezvousMgr`: one [`RemoteRendezvous`] per step, tensors buffered at their
//! producer until received, receives of a peer's tensors pulled over that peer's link.
//!
//! A `RemoteRendezvous` is made in two phases, as TF's: [`RendezvousMgr::find`] returns it at once,
//! and [`RemoteRendezvous::initialize`] later gives it the worker's session (its task name and its
//! links). `send` works before that (it only buffers); a receive waits for it.
//!
//! [`RendezvousMgr::cleanup`] removes a step and fails whatever still waits on it. A step id that
//! was cleaned up stays refused for a while ([`REMEMBERED_CLEANUPS`] ids), so that a peer's late
//! request for one of its tensors is told so instead of re-creating the step and leaking it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use super::links::Links;
use super::{LocalRendezvous, ParsedKey, Received, RendezvousError, Tensor};

/// How many cleaned-up step ids are remembered.
pub const REMEMBERED_CLEANUPS: usize = 4096;

/// What a step's rendezvous needs from its worker.
#[derive(Clone)]
pub struct WorkerSession {
    /// This worker's task, `/job:NAME/replica:R/task:T`: keys whose source device is on it are
    /// received locally, all others from their source task's link.
    pub task: String,
    pub links: Links,
}

pub struct RemoteRendezvous {
    step_id: i64,
    local: LocalRendezvous,
    session: watch::Sender<Option<WorkerSession>>,
    aborted: watch::Sender<Option<RendezvousError>>,
}

impl RemoteRendezvous {
    fn new(step_id: i64) -> Self {
        Self {
            step_id,
            local: LocalRendezvous::default(),
            session: watch::Sender::new(None),
            aborted: watch::Sender::new(None),
        }
    }

    pub fn step_id(&self) -> i64 {
        self.step_id
    }

    /// The second phase of construction. A second call keeps the first session.
    pub fn initialize(&self, session: WorkerSession) -> Result<(), RendezvousError> {
        let mut done = true;
        self.session.send_if_modified(|s| {
            done = s.is_none();
            if done {
                *s = Some(session);
            }
            done
        });
        if done {
            Ok(())
        } else {
            Err(RendezvousError::new(
                tonic::Code::AlreadyExists,
                format!(
                    "the rendezvous of step {} is already initialized",
                    self.step_id
                ),
            ))
        }
    }

    /// Buffers `tensor` for its receiver. Never blocks.
    pub fn send(
        &self,
        key: &ParsedKey,
        tensor: Tensor,
        is_dead: bool,
    ) -> Result<(), RendezvousError> {
        self.local.send(key, tensor, is_dead)
    }

    /// Receives `key`: from this worker's own buffer if this worker produced it, else from the
    /// producer's link. Fails at once when the step is aborted or the producer is declared dead.
    pub async fn recv(&self, key: &ParsedKey) -> Result<Received, RendezvousError> {
        let mut aborted = self.aborted.subscribe();
        let abort = async move {
            match aborted.wait_for(Option::is_some).await {
                Ok(e) => e
                    .clone()
                    .unwrap_or_else(|| RendezvousError::aborted("aborted")),
                Err(_) => RendezvousError::aborted("the rendezvous went away"),
            }
        };
        tokio::select! {
            e = abort => Err(e),
            r = self.recv_inner(key) => r,
        }
    }

    async fn recv_inner(&self, key: &ParsedKey) -> Result<Received, RendezvousError> {
        let session = self.session().await?;
        let producer = key.src.task_name();
        if producer == session.task {
            return self.local.recv(key).await;
        }
        tokio::select! {
            e = session.links.wait_dead(&producer) => Err(e),
            r = session.links.fetch(&producer, self.step_id, key, &session.task) => r,
        }
    }

    async fn session(&self) -> Result<WorkerSession, RendezvousError> {
        let mut rx = self.session.subscribe();
        let s = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| RendezvousError::aborted("the rendezvous went away"))?;
        s.clone()
            .ok_or_else(|| RendezvousError::aborted("the rendezvous has no session"))
    }

    /// Receives a tensor this worker produced (what a peer's link request does).
    pub async fn recv_local(&self, key: &ParsedKey) -> Result<Received, RendezvousError> {
        self.local.recv(key).await
    }

    /// Fails every pending and later call with `error` (the first abort's error wins).
    pub fn start_abort(&self, error: RendezvousError) {
        self.aborted.send_if_modified(|a| {
            let first = a.is_none();
            if first {
                *a = Some(error.clone());
            }
            first
        });
        self.local.start_abort(error);
    }

    /// Keys with a buffered tensor or a waiting local receive.
    pub fn pending(&self) -> usize {
        self.local.pending()
    }
}

#[derive(Default)]
struct Steps {
    live: HashMap<i64, Arc<RemoteRendezvous>>,
    cleaned: HashSet<i64>,
    cleaned_order: VecDeque<i64>,
}

/// A worker's rendezvous manager. Cloning is cheap; clones share the steps.
#[derive(Clone, Default)]
pub struct RendezvousMgr {
    steps: Arc<Mutex<Steps>>,
}

impl RendezvousMgr {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Steps> {
        self.steps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The rendezvous of `step_id`, made if needed. A step cleaned up recently gets a fresh
    /// rendezvous that is already aborted, so nothing can be buffered in it.
    pub fn find(&self, step_id: i64) -> Arc<RemoteRendezvous> {
        let mut steps = self.lock();
        if steps.cleaned.contains(&step_id) {
            let r = Arc::new(RemoteRendezvous::new(step_id));
            r.start_abort(cleaned_up(step_id));
            return r;
        }
        steps
            .live
            .entry(step_id)
            .or_insert_with(|| Arc::new(RemoteRendezvous::new(step_id)))
            .clone()
    }

    /// Receives, from this worker's buffer, a tensor it produced in `step_id`.
    pub async fn recv_local(
        &self,
        step_id: i64,
        key: &ParsedKey,
    ) -> Result<Received, RendezvousError> {
        self.find(step_id).recv_local(key).await
    }

    /// [`Self::recv_local`] with a callback, as TF's `RecvLocalAsync`: `done` runs on the runtime
    /// once the tensor is there or the receive failed.
    pub fn recv_local_async(
        &self,
        step_id: i64,
        key: ParsedKey,
        done: impl FnOnce(Result<Received, RendezvousError>) + Send + 'static,
    ) {
        let r = self.find(step_id);
        tokio::spawn(async move { done(r.recv_local(&key).await) });
    }

    /// Removes the rendezvous of `step_id`, failing what still waits on it.
    pub fn cleanup(&self, step_id: i64) {
        let removed = {
            let mut steps = self.lock();
            if steps.cleaned.insert(step_id) {
                steps.cleaned_order.push_back(step_id);
                while steps.cleaned_order.len() > REMEMBERED_CLEANUPS {
                    if let Some(old) = steps.cleaned_order.pop_front() {
                        steps.cleaned.remove(&old);
                    }
                }
            }
            steps.live.remove(&step_id)
        };
        if let Some(r) = removed {
            r.start_abort(cleaned_up(step_id));
        }
    }

    /// Removes every step.
    pub fn cleanup_all(&self) {
        let ids: Vec<i64> = self.lock().live.keys().copied().collect();
        for id in ids {
            self.cleanup(id);
        }
    }

    /// Steps alive now.
    pub fn live_steps(&self) -> usize {
        self.lock().live.len()
    }
}

fn cleaned_up(step_id: i64) -> RendezvousError {
    RendezvousError::aborted(format!("step {step_id} was cleaned up"))
}

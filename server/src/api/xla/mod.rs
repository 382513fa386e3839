//! The `xla.coordination.CoordinationService` wire adapter: what jaxlib 0.10+ speaks. Like
//! [`crate::api::tf`], it only decodes, routes to the leader and encodes; the semantics are
//! [`KvCore`]'s and [`CoordCore`]'s, shared with the TensorFlow surface.
//!
//! What XLA adds on the wire:
//! - tasks are integer ids, all of one configured job (`--xla-job`);
//! - every request but RegisterTask carries the service incarnation, and a stale one is refused
//!   (INTERNAL with a `ServiceMismatchError`), so a client never talks to a service that lost its
//!   state. Ours is the cluster's, fixed when the ensemble set the cluster up, so failover never
//!   trips it;
//! - every error the service itself produces carries a `CoordinationServiceError` in
//!   `grpc-status-details-bin` (barrier errors a `BarrierError` too): jaxlib takes an error
//!   without one for a broken connection. Routing's UNAVAILABLE ("try another replica") is sent
//!   without, on purpose (see [`errors`]);
//! - RegisterTask waits at a register barrier of every task (as JAX configures its service).
//!
//! [`service`] holds the RPCs (GetAliveTasks in [`alive`], WatchTasks in [`watch`]); this module
//! the service's state and the helpers they share.

mod alive;
pub mod errors;
mod rounds;
mod service;
mod watch;

use std::sync::Arc;

use crate::raft::peers::PeerChannel;
use bytes::Bytes;
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient;
use coord_raft_store::state::{Cluster, TaskName, TaskSet, TaskState};
use tonic::{Request, Response, Status};

use crate::error::CoordError;
use crate::raft::peers::PEER_MESSAGE_LIMIT;
use crate::serve::coordination::CoordCore;
use crate::serve::kv::KvCore;
use crate::serve::route::Router;
use errors::{detailed, refused, service_mismatch};

pub struct XlaService {
    /// Itself, for the futures of deferred calls (see `api::deferred`), which outlive a handler.
    me: std::sync::Weak<XlaService>,
    router: Arc<Router>,
    kv: Arc<KvCore>,
    coord: Arc<CoordCore>,
    /// Large key-value answers, encoded once for every reader (see `api::value_answers`).
    values: crate::api::value_answers::ValueAnswers,
    /// GetAliveTasks rounds' answers, encoded once for every asker (see `alive`).
    alive: crate::api::shared_answer::Encodings<Vec<(TaskName, u64)>>,
    /// WatchTasks' answers, a job's task records at one version, encoded once for every watcher
    /// (see `watch`).
    watched: crate::api::shared_answer::Encodings<crate::serve::coordination::JobTasks>,
    /// The same answers as a follower relays them from the leader, kept by their bytes.
    relayed: crate::api::shared_answer::Relayed,
    /// The rounds a follower's callers wait on, each with one wait on the leader (see `rounds`).
    rounds: crate::api::relayed_waits::SharedWaits<
        (crate::serve::namespace::Ns, TaskSet, u64),
        Arc<crate::api::shared_answer::AnswerBytes>,
    >,
    /// A follower's callers' asks about a set, recorded on the leader together (see `rounds`).
    asks: crate::api::relayed_asks::Batches<AskKind, Asked, Result<u64, Status>>,
    /// A follower's callers of one GetKeyValue, answered by one read on the leader (see
    /// `api::relayed_reads`).
    reads:
        crate::api::relayed_reads::RelayedReads<xla::GetKeyValueRequest, xla::GetKeyValueResponse>,
    /// `--xla-job`; `None` = the first job of the replicated cluster configuration.
    job: Option<String>,
}

/// The asks a follower records on the leader together: of one namespace, request-id client and
/// set.
type AskKind = (crate::serve::namespace::Ns, Option<u64>, TaskSet);
/// One caller's ask as the follower records it: the task's own request (its `task_ids` left to
/// the set), its request id, and the leader's channel and the forward's metadata as the caller's
/// routing last saw them.
pub(super) type Asked = (
    xla::GetAliveTasksRequest,
    Option<coord_proto::metadata::WireRequestId>,
    PeerChannel,
    tonic::metadata::MetadataMap,
);

crate::api::value_answers::carries_values!(
    single: xla::GetKeyValueResponse, xla::TryGetKeyValueResponse;
    dir: xla::GetKeyValueDirResponse
);

fn client(ch: PeerChannel) -> CoordinationServiceClient<PeerChannel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

fn entry(key: String, value: Bytes) -> xla::KeyValueEntry {
    xla::KeyValueEntry { key, value }
}

/// `Incarnations` as a request carries it: the service incarnation it believes in.
fn claimed_incarnation(i: Option<&xla::Incarnations>) -> u64 {
    i.map_or(0, |i| i.service_incarnation)
}

fn state_of(s: TaskState) -> xla::TaskState {
    match s {
        TaskState::Disconnected => xla::TaskState::TaskstateDisconnected,
        TaskState::Connected => xla::TaskState::TaskstateConnected,
        TaskState::Error => xla::TaskState::TaskstateError,
    }
}

impl XlaService {
    pub fn new(
        router: Arc<Router>,
        kv: Arc<KvCore>,
        coord: Arc<CoordCore>,
        job: Option<String>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            router,
            kv,
            coord,
            values: Default::default(),
            alive: Default::default(),
            watched: Default::default(),
            relayed: Default::default(),
            rounds: Default::default(),
            asks: Default::default(),
            reads: Default::default(),
            job,
        })
    }

    /// This service, owned: what a deferred call's future holds (it outlives the handler).
    fn owned(&self) -> Result<Arc<Self>, Status> {
        crate::api::deferred::owned(&self.me)
    }

    /// The XLA job's name and task count, from the replicated configuration. In a named
    /// namespace, `--xla-job` counts only if the namespace has that job; otherwise its first job is
    /// the XLA job (a jaxlib job has one).
    fn job(&self) -> Result<(String, u32), CoordError> {
        let named = crate::serve::namespace::current().is_some();
        let found = self.coord.reader.read(|a| {
            let c: &Cluster = a.state.cluster.as_ref()?;
            let flagged = self
                .job
                .as_ref()
                .filter(|j| !named || c.config.jobs.contains_key(*j));
            let (name, n) = match flagged {
                Some(j) => (j.clone(), c.config.jobs.get(j).copied()),
                None => c
                    .config
                    .jobs
                    .iter()
                    .next()
                    .map(|(j, n)| (j.clone(), Some(*n)))?,
            };
            Some((name, n))
        });
        match found {
            None => Err(CoordError::Unavailable(
                "the coordination service has no cluster configuration yet".into(),
            )),
            Some((name, None)) => Err(detailed(CoordError::Internal(format!(
                "--xla-job {name:?} is not a job of the cluster; XLA task ids cannot be served"
            )))),
            Some((name, Some(n))) => Ok((name, n)),
        }
    }

    /// The task XLA's id `id` names (in `field`), checked against the job's size.
    fn task(&self, id: i32, field: &str) -> Result<TaskName, CoordError> {
        let (job, n) = self.job()?;
        task_of(&job, n, id, field)
    }

    /// Over TLS, a task's certificate acts only as its own task (see `authz`): `id` is the XLA
    /// task id the request names in `field`. A refusal carries XLA's error payload.
    pub(crate) fn acting_as<T>(
        &self,
        req: &Request<T>,
        method: &'static str,
        field: &str,
        id: i32,
    ) -> Result<(), Status> {
        let check = self.router.authz().acting_as_with(req, method, field, || {
            let (job, _) = self.job().map_err(Status::from)?;
            Ok((job, i64::from(id)))
        });
        self.router.checked(method, check.map_err(refused))
    }

    /// The calling task and the participants a Barrier call names, checked as that call checks
    /// them, its service incarnation first.
    pub(crate) fn barrier_named(
        &self,
        m: &xla::BarrierRequest,
    ) -> Result<(TaskName, Vec<TaskName>), CoordError> {
        self.check_incarnation(m.incarnations.as_ref())
            .and_then(|()| self.task(m.source_task_id, "source_task_id"))
            .and_then(|s| Ok((s, self.tasks(&m.task_ids, "task_ids")?)))
    }

    /// Every task of `ids` (the job read once for all of them).
    fn tasks(&self, ids: &[i32], field: &str) -> Result<Vec<TaskName>, CoordError> {
        let (job, n) = self.job()?;
        ids.iter().map(|&i| task_of(&job, n, i, field)).collect()
    }

    /// Every task of `ids`, as the runs a command carries (see `state::task_set`): each id is
    /// checked, but no task name is made.
    fn task_set(&self, ids: &[i32], field: &str) -> Result<TaskSet, CoordError> {
        let (job, n) = self.job()?;
        let ids = ids
            .iter()
            .map(|&i| match u32::try_from(i) {
                Ok(t) if t < n => Ok(t),
                _ => task_of(&job, n, i, field).map(|t| t.task),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Ok(TaskSet::of_job(&job, ids))
    }

    /// Every task of the job, as runs.
    fn whole_job(&self) -> Result<TaskSet, CoordError> {
        let (job, n) = self.job()?;
        Ok(TaskSet::whole_job(&job, n))
    }

    /// Refuses a request made for another service incarnation (another service, or one that
    /// lost its state): the client must not carry on against it.
    fn check_incarnation(&self, i: Option<&xla::Incarnations>) -> Result<(), CoordError> {
        let ours = self.coord.service_incarnation()?;
        let theirs = claimed_incarnation(i);
        if theirs == ours {
            return Ok(());
        }
        Err(service_mismatch(theirs, ours))
    }
}

/// Task `id` of `job` (which has `n` tasks), or INVALID_ARGUMENT naming it.
fn task_of(job: &str, n: u32, id: i32, field: &str) -> Result<TaskName, CoordError> {
    match u32::try_from(id) {
        Ok(t) if t < n => Ok(TaskName::new(job, t)),
        _ => Err(detailed(CoordError::InvalidArgument(format!(
            "{field}: task {id} is not a task of job {job:?} (tasks 0..{})",
            n.saturating_sub(1)
        )))),
    }
}

/// Runs `f`, giving its service errors their XLA payload. (Not an `async fn`: one would keep
/// `f` twice, as its argument and as what it awaits, and a parked call keeps this future.)
fn served<T>(
    f: impl std::future::Future<Output = Result<T, CoordError>>,
) -> impl std::future::Future<Output = Result<T, CoordError>> {
    futures::FutureExt::map(f, |r| r.map_err(detailed))
}

/// A routed call's response, sent from an answer's shared bytes (the message stays empty: the
/// response layer sends the bytes instead; see `api::shared_answer`).
fn answered_from_shared<M: Default>(
    routed: Result<Response<Arc<crate::api::shared_answer::AnswerBytes>>, Status>,
) -> Result<Response<M>, Status> {
    let mut r = Response::new(M::default());
    r.extensions_mut()
        .insert(crate::api::shared_answer::SharedAnswer(
            routed?.into_inner(),
        ));
    Ok(r)
}

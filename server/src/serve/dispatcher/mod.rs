//! The tf.data dispatcher, served by the leader over the one replicated state of
//! `coord_raft_store::dispatcher`: every change is one Raft command (the log is the journal),
//! reads wait for the read index and read the applied state.
//!
//! Every namespace has a dispatcher of its own: a call acts on its namespace's
//! `DispatcherState` (commits are bound by the proposer, reads by [`NsReader`]) and its
//! namespace's leader [`memory`]; the [`timers`] judge every namespace's.
//!
//! Two wire surfaces read and change that one state, each a thin adapter that translates its
//! messages and codes: [`tf`], TensorFlow 2.21's `tensorflow.data.DispatcherService` (unmodified
//! TF workers and `distribute()` clients), and [`coord`], coord's own `coord.dispatcher`
//! protocol (coord's data workers and consumers, with leased splits). What they share is here:
//! the commit and read paths, the leader's memory, the timers, round-robin rounds, the journal,
//! metrics and the operators' views.
//!
//! - [`memory`]: the leader's soft state (heartbeat times, rounds, task removal agreements).
//! - [`timers`]: worker and client timeouts, collection of idle iterations.
//! - [`remover`]: consumers' agreement to remove a round-robin task.
//! - [`push`]: new tasks pushed to TensorFlow's workers (`ProcessTask`).
//! - [`report`]: jobs, iterations and workers for operators; [`metrics`]: their part of
//!   `/metrics`; [`journal`]: the journal, read back from the Raft log.

pub mod coord;
pub mod journal;
pub mod memory;
pub mod metrics;
pub mod push;
pub mod remover;
mod report;
pub mod tf;
pub mod timers;

use std::sync::Arc;

use coord_raft_store::dispatcher::{DispatcherOp, DispatcherOutput, DispatcherState};
use coord_raft_store::{Command, Op, Output, RequestId};

use crate::error::CoordError;
use crate::serve::namespace::{self, NsReader};
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;
use memory::{Memories, Memory};

/// The dispatcher's settings (flags of the coordinator).
#[derive(Clone, Debug, Default)]
pub struct DispatcherConfig {
    /// TensorFlow's `DispatcherConfig.worker_addresses`: the fixed worker list static sharding
    /// of TensorFlow's needs (`host:port`, or `host:%port%` for any port on that host).
    pub worker_addresses: Vec<String>,
    pub client_timeout_ms: u64,
    /// An iteration without clients this long is collected (never a DYNAMIC one).
    pub job_gc_timeout_ms: u64,
    /// A coord data worker silent this long is dead: its leased splits go out again.
    pub data_worker_timeout_ms: u64,
    /// A TensorFlow worker silent this long gets no task of new iterations until it is back.
    pub tf_worker_timeout_ms: u64,
}

impl DispatcherConfig {
    pub fn from_args(args: &crate::ops::config::Args) -> Self {
        Self {
            worker_addresses: args.tfdata_worker_addresses.clone(),
            client_timeout_ms: args.dispatcher_client_timeout_ms,
            job_gc_timeout_ms: args.dispatcher_job_gc_timeout_ms,
            data_worker_timeout_ms: args.dispatcher_worker_timeout_ms,
            tf_worker_timeout_ms: args.tfdata_worker_timeout_ms,
        }
    }
}

pub struct DispatcherCore {
    pub proposer: Proposer,
    pub read_index: ReadIndex,
    pub reader: NsReader,
    pub memories: Memories,
    pub push: push::WorkerPush,
    pub config: DispatcherConfig,
}

pub(crate) fn unexpected(what: &str, out: &Output) -> CoordError {
    CoordError::Internal(format!("{what} returned {out:?}"))
}

/// The leader's clock in microseconds, as TensorFlow's dispatcher keeps times.
pub fn now_micros() -> i64 {
    i64::try_from(crate::serve::proposer::now_ms())
        .unwrap_or(i64::MAX)
        .saturating_mul(1000)
}

impl DispatcherCore {
    /// Commits one update and returns what it answered.
    pub(crate) async fn commit(
        &self,
        request: Option<RequestId>,
        op: DispatcherOp,
    ) -> Result<DispatcherOutput, CoordError> {
        let what = op.to_string();
        match self
            .proposer
            .propose(Command {
                request,
                op: Op::Dispatcher(op),
            })
            .await??
        {
            Output::Dispatcher(o) => Ok(o),
            other => Err(unexpected(&what, &other)),
        }
    }

    /// Reads the applied state after a linearizable read barrier.
    pub(crate) async fn read<T>(
        &self,
        f: impl FnOnce(&DispatcherState) -> T,
    ) -> Result<T, CoordError> {
        self.read_index.linearize().await?;
        Ok(self.applied(f))
    }

    /// Reads the applied state as it is (after a commit of this leader's, it includes it).
    pub(crate) fn applied<T>(&self, f: impl FnOnce(&DispatcherState) -> T) -> T {
        self.reader.read(|v| f(&v.state.dispatcher))
    }

    /// The leader's memory of the current namespace's dispatcher.
    pub(crate) fn memory(&self) -> Arc<Memory> {
        self.memories.of(&namespace::current())
    }

    /// A client's heartbeat with its rounds: `check` (the surface's, in its words) refuses an
    /// unknown client; when the rounds move its iteration's front pending task (the client
    /// rejects its target, or agrees to it), they are committed. Either way the leader remembers
    /// the round the client reads.
    pub(crate) async fn client_rounds(
        &self,
        id: Option<RequestId>,
        client: i64,
        (current_round, blocked_round): (Option<i64>, Option<i64>),
        check: impl FnOnce(&DispatcherState) -> Result<(), CoordError>,
    ) -> Result<(), CoordError> {
        let client_round = self.memory().client_heard(client, current_round);
        let moves_a_pending_task = self
            .read(|s| {
                check(s)?;
                let it = s.clients.get(&client).and_then(|i| s.iterations.get(i));
                Ok::<_, CoordError>(it.and_then(|it| it.pending.front()).is_some_and(|p| {
                    current_round.unwrap_or(0) >= p.target_round
                        || (blocked_round.is_some_and(|b| b <= p.target_round)
                            && !p.ready.contains(&client))
                }))
            })
            .await??;
        if moves_a_pending_task {
            let op = DispatcherOp::ClientHeartbeat {
                client,
                current_round,
                blocked_round,
                client_round,
            };
            self.commit(id, op).await?;
        }
        Ok(())
    }
}

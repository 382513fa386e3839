//! The write path on the leader: client commands are batched into Raft entries.
//!
//! openraft 0.9 appends and syncs one entry at a time, so one entry per client write would cap
//! throughput at one fsync per write. Instead one task takes every command that is waiting, packs
//! them into a single [`Proposal`] and proposes it; at most `max_in_flight` entries are
//! outstanding, and whatever arrives meanwhile goes into the next one. Under load an entry carries
//! many writes and costs one append, one replication round and one fsync on each replica; a lone
//! writer is proposed at once, alone.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use coord_raft_store::command::{Command, CommandResult, Op, Proposal};
use coord_raft_store::stats::Histogram;
use coord_raft_store::types::Raft;
use openraft::error::ClientWriteError;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::error::CoordError;
use crate::tasks::TaskGuard;

/// At most this many commands go into one entry.
const MAX_BATCH_COMMANDS: usize = 1024;
/// An entry stops growing past this many bytes of keys and values (one command may exceed it).
const MAX_BATCH_BYTES: usize = 4 << 20;

struct Pending {
    command: Command,
    reply: oneshot::Sender<Result<CommandResult, CoordError>>,
}

/// What the proposer reports to metrics.
#[derive(Default)]
pub struct ProposerStats {
    /// Commands waiting for a place in an entry.
    pub queued: AtomicI64,
    /// From submission to applied result.
    pub commit_latency: Histogram,
    /// Commands per proposed entry.
    pub entries: std::sync::atomic::AtomicU64,
    pub commands: std::sync::atomic::AtomicU64,
}

#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<Pending>,
    stats: Arc<ProposerStats>,
    raft: Raft,
    /// One permit per entry in flight, shared by the batching task and the fast path.
    slots: Arc<Semaphore>,
    me: u64,
}

impl Proposer {
    pub fn start(raft: Raft, me: u64, max_in_flight: usize, tasks: &mut TaskGuard) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(ProposerStats::default());
        let slots = Arc::new(Semaphore::new(max_in_flight));
        tasks.spawn(
            "proposer",
            run(raft.clone(), rx, slots.clone(), stats.clone()),
        );
        Self {
            tx,
            stats,
            raft,
            slots,
            me,
        }
    }

    pub fn stats(&self) -> &Arc<ProposerStats> {
        &self.stats
    }

    /// Commits `command` through Raft and returns its result once applied on this (leader)
    /// replica.
    pub async fn propose(&self, command: Command) -> Result<CommandResult, CoordError> {
        let started = Instant::now();
        // Fast path: nothing is waiting and an entry slot is free, so there is nothing to batch
        // with; propose from this task and skip the hand-offs to and from the batching task.
        if self.stats.queued.load(Ordering::Relaxed) == 0 {
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                self.stats.entries.fetch_add(1, Ordering::Relaxed);
                self.stats.commands.fetch_add(1, Ordering::Relaxed);
                let (reply, rx) = oneshot::channel();
                match self
                    .raft
                    .client_write_ff(Proposal::new(now_ms(), vec![command]))
                    .await
                {
                    Err(fatal) => {
                        return Err(CoordError::Unavailable(format!(
                            "Raft has stopped: {fatal}"
                        )))
                    }
                    Ok(result_rx) => {
                        let result = result_rx.await;
                        drop(slot);
                        deliver(result, vec![reply]);
                    }
                }
                let result = rx.await.map_err(|_| CoordError::LeaderChanged)?;
                self.stats.commit_latency.record(started.elapsed());
                return result;
            }
        }
        let (reply, rx) = oneshot::channel();
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(Pending { command, reply }).is_err() {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(CoordError::Unavailable(format!(
                "replica {} is shutting down",
                self.me
            )));
        }
        let result = rx.await.map_err(|_| CoordError::LeaderChanged)?;
        self.stats.commit_latency.record(started.elapsed());
        result
    }
}

fn command_bytes(c: &Command) -> usize {
    64 + match &c.op {
        Op::KvPut { key, value, .. } => key.len() + value.len(),
        Op::KvDelete { key } | Op::KvIncrement { key, .. } => key.len(),
        Op::WaitForAllTasks { devices, .. } => match devices {
            coord_raft_store::state::DeviceInfo::Tf(list) => list.iter().map(|d| d.len()).sum(),
            coord_raft_store::state::DeviceInfo::Xla(b) => b.len(),
        },
        _ => 0,
    }
}

/// The leader's wall clock in milliseconds since the Unix epoch: the time proposals carry, and
/// the clock every leader timer compares with.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

async fn run(
    raft: Raft,
    mut rx: mpsc::UnboundedReceiver<Pending>,
    slots: Arc<Semaphore>,
    stats: Arc<ProposerStats>,
) {
    while let Some(first) = rx.recv().await {
        // Waiting for a slot is what lets a batch form under load.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut bytes = command_bytes(&first.command);
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_COMMANDS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += command_bytes(&p.command);
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        stats
            .queued
            .fetch_sub(batch.len() as i64, Ordering::Relaxed);
        stats.entries.fetch_add(1, Ordering::Relaxed);
        stats
            .commands
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let (commands, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        let proposal = Proposal::new(now_ms(), commands);
        match raft.client_write_ff(proposal).await {
            Err(fatal) => {
                let msg = format!("Raft has stopped: {fatal}");
                for r in replies {
                    let _ = r.send(Err(CoordError::Unavailable(msg.clone())));
                }
            }
            Ok(result_rx) => {
                tokio::spawn(async move {
                    let result = result_rx.await;
                    drop(slot);
                    deliver(result, replies);
                });
            }
        }
    }
}

type WriteOutcome = Result<
    Result<
        openraft::raft::ClientWriteResponse<coord_raft_store::TypeConfig>,
        ClientWriteError<u64, openraft::BasicNode>,
    >,
    oneshot::error::RecvError,
>;

fn deliver(result: WriteOutcome, replies: Vec<oneshot::Sender<Result<CommandResult, CoordError>>>) {
    match result {
        Ok(Ok(resp)) => {
            if resp.data.len() != replies.len() {
                let msg = format!(
                    "entry {} returned {} results for {} commands",
                    resp.log_id,
                    resp.data.len(),
                    replies.len()
                );
                for r in replies {
                    let _ = r.send(Err(CoordError::Internal(msg.clone())));
                }
                return;
            }
            for (r, out) in replies.into_iter().zip(resp.data) {
                let _ = r.send(Ok(out));
            }
        }
        Ok(Err(ClientWriteError::ForwardToLeader(f))) => {
            let leader = f.leader_id.zip(f.leader_node.map(|n| n.addr));
            for r in replies {
                let _ = r.send(Err(CoordError::NotLeader {
                    me: 0,
                    leader: leader.clone(),
                }));
            }
        }
        Ok(Err(ClientWriteError::ChangeMembershipError(e))) => {
            for r in replies {
                let _ = r.send(Err(CoordError::Internal(e.to_string())));
            }
        }
        // The leader stepped down before the entry's fate was known here.
        Err(_) => {
            for r in replies {
                let _ = r.send(Err(CoordError::LeaderChanged));
            }
        }
    }
}

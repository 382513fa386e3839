//! The write path on the leader: client commands are batched into Raft entries.
//!
//! openraft 0.9 appends and syncs one entry at a time, so one entry per client write would cap
//! throughput at one fsync per write. Instead one task takes every command that is waiting, packs
//! them into a single [`Proposal`] and proposes it; at most `max_in_flight` entries are
//! outstanding, and whatever arrives meanwhile goes into the next one. Under load an entry carries
//! many writes and costs one append, one replication round and one fsync on each replica; a lone
//! writer is proposed at once, alone.
//!
//! Every entry's wait is bounded, and its slot always comes back. openraft answers an entry's
//! writes when the entry is applied, or truncated as a conflict; nothing else. A deposed leader
//! whose log the new leader's snapshot overtakes (installing it purges the shorter log without a
//! conflict) never hears of its entries again: before, their slots stayed taken, and when that
//! replica led again it served reads but proposed no write (chaos seed 424243: 47 s without a
//! write). So an entry is also given up when this replica stops leading (a higher term, or no
//! quorum acknowledgement within the lease: [`LeaderWatch::lost`]), and, should a leader in
//! office fail to commit it, after [`COMMIT_PATIENCE`]. Its writers are then told the outcome is
//! unknown; routing drives them again, with the same request ids, wherever leadership is, so a
//! write applies once whichever copy commits.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use coord_raft_store::command::{Command, CommandResult, Op, Proposal};
use coord_raft_store::stats::Histogram;
use coord_raft_store::types::Raft;
use openraft::error::ClientWriteError;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::error::CoordError;
use crate::raft::leader::LeaderWatch;
use crate::serve::namespace;
use crate::tasks::TaskGuard;

/// At most this many commands go into one entry.
const MAX_BATCH_COMMANDS: usize = 1024;
/// An entry stops growing past this many bytes of keys and values (one command may exceed it).
const MAX_BATCH_BYTES: usize = 4 << 20;
/// How long an entry may stay uncommitted while this replica leads before its writes are told
/// the outcome is unknown and its slot is taken back. A leader in office has had a quorum's
/// acknowledgement within the lease (300 ms by default), and a commit takes milliseconds: an
/// entry this old is stuck, not slow.
pub const COMMIT_PATIENCE: Duration = Duration::from_secs(3);

struct Pending {
    command: Command,
    reply: oneshot::Sender<Result<CommandResult, CoordError>>,
}

/// What the proposer reports to metrics.
pub struct ProposerStats {
    /// Commands waiting for a place in an entry.
    pub queued: AtomicI64,
    /// Entries proposed whose fate is not known yet (each holds a slot).
    pub in_flight: AtomicI64,
    /// From submission to applied result.
    pub commit_latency: Histogram,
    /// Commands per proposed entry.
    pub entries: AtomicU64,
    pub commands: AtomicU64,
    /// Entries given up because this replica stopped leading before openraft answered them.
    pub abandoned_leader_lost: AtomicU64,
    /// Entries given up after [`COMMIT_PATIENCE`] on a replica that still led.
    pub abandoned_stuck: AtomicU64,
    /// When an entry was last proposed or settled, in ms since `origin`.
    last_progress_ms: AtomicU64,
    origin: Instant,
}

impl Default for ProposerStats {
    fn default() -> Self {
        Self {
            queued: AtomicI64::new(0),
            in_flight: AtomicI64::new(0),
            commit_latency: Histogram::default(),
            entries: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            abandoned_leader_lost: AtomicU64::new(0),
            abandoned_stuck: AtomicU64::new(0),
            last_progress_ms: AtomicU64::new(0),
            origin: Instant::now(),
        }
    }
}

impl ProposerStats {
    fn progressed(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_progress_ms.store(ms, Ordering::Relaxed);
    }

    /// How long writes have been waiting (queued, or in an entry) with no entry proposed or
    /// settled meanwhile; zero when none wait. A healthy leader keeps this near zero under any
    /// load; a growing value is a leader that cannot propose.
    pub fn stalled_for(&self) -> Duration {
        let waiting =
            self.queued.load(Ordering::Relaxed) > 0 || self.in_flight.load(Ordering::Relaxed) > 0;
        if !waiting {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_progress_ms.load(Ordering::Relaxed));
        self.origin.elapsed().saturating_sub(last)
    }
}

#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<Pending>,
    /// What an entry in flight waits on besides openraft; shared with the batching task.
    waits: Waits,
    /// One permit per entry in flight, shared by the batching task and the fast path.
    slots: Arc<Semaphore>,
    me: u64,
}

/// What bounds an entry's wait (see the module doc).
#[derive(Clone)]
struct Waits {
    raft: Raft,
    leader: LeaderWatch,
    stats: Arc<ProposerStats>,
    /// True while a leader handoff holds new entries back (see [`Proposer::hold`]).
    held: Arc<tokio::sync::watch::Sender<bool>>,
    /// Read-held by an entry from its look at `held` until it counts as in flight, so that a
    /// hold, taken under the write side, knows every entry proposed before it is counted.
    gate: Arc<tokio::sync::RwLock<()>>,
}

/// New entries are held back while this lives; see [`Proposer::hold`].
pub struct Hold(Arc<tokio::sync::watch::Sender<bool>>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

impl Proposer {
    pub fn start(
        raft: Raft,
        me: u64,
        max_in_flight: usize,
        leader: LeaderWatch,
        tasks: &mut TaskGuard,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let waits = Waits {
            raft,
            leader,
            stats: Arc::default(),
            held: Arc::new(tokio::sync::watch::channel(false).0),
            gate: Arc::default(),
        };
        let slots = Arc::new(Semaphore::new(max_in_flight));
        tasks.spawn("proposer", run(waits.clone(), rx, slots.clone()));
        Self {
            tx,
            waits,
            slots,
            me,
        }
    }

    pub fn stats(&self) -> &Arc<ProposerStats> {
        &self.waits.stats
    }

    /// Holds new entries back until the returned [`Hold`] is dropped, so that the log stops
    /// growing while leadership is handed over (`raft::handoff`): a write arriving meanwhile
    /// waits, and if this replica stops leading it is told so and routing drives it again on the
    /// new leader with its request id. Returns once every entry proposed before the hold was
    /// answered (committed and applied), or after `within`.
    pub async fn hold(&self, within: Duration) -> Hold {
        {
            let _every_entry_counted = self.waits.gate.write().await;
            self.waits.held.send_replace(true);
        }
        let hold = Hold(self.waits.held.clone());
        let deadline = Instant::now() + within;
        while self.waits.stats.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        hold
    }

    /// Proposes `op` on the leader's own behalf (no request id) without waiting for it: a leader
    /// duty's decision (a timeout, a collection), which the next leader makes again if this one
    /// is lost with its leadership.
    pub fn propose_decision(&self, op: Op) {
        // Bound here: the spawned task is outside the call's namespace.
        let op = namespace::bind_to(&namespace::current(), op);
        let proposer = self.clone();
        tokio::spawn(async move {
            let what = op.to_string();
            if let Err(e) = proposer.propose(Command { request: None, op }).await {
                tracing::warn!(update = %what, error = %e, "could not commit a leader's decision; the next leader will judge again");
            }
        });
    }

    /// Commits `command` through Raft, in the current namespace, and returns its result once
    /// applied on this (leader) replica.
    pub async fn propose(&self, command: Command) -> Result<CommandResult, CoordError> {
        let command = namespace::bind(command);
        let started = Instant::now();
        let stats = &self.waits.stats;
        // Fast path: nothing is waiting and an entry slot is free, so there is nothing to batch
        // with; propose from this task and skip the hand-offs to and from the batching task.
        if stats.queued.load(Ordering::Relaxed) == 0 {
            if let Ok(slot) = self.slots.clone().try_acquire_owned() {
                let result = self
                    .waits
                    .commit(vec![command], slot)
                    .await
                    .pop()
                    .unwrap_or_else(|| {
                        Err(CoordError::Internal("an entry without results".into()))
                    });
                stats.commit_latency.record(started.elapsed());
                return result;
            }
        }
        let (reply, rx) = oneshot::channel();
        stats.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(Pending { command, reply }).is_err() {
            stats.queued.fetch_sub(1, Ordering::Relaxed);
            return Err(CoordError::Unavailable(format!(
                "replica {} is shutting down",
                self.me
            )));
        }
        let result = rx.await.map_err(|_| CoordError::LeaderChanged)?;
        stats.commit_latency.record(started.elapsed());
        result
    }
}

impl Waits {
    /// Proposes `commands` as one entry holding `slot`, and returns each command's result once
    /// the entry's fate is known or it is given up (the slot returns either way).
    async fn commit(
        &self,
        commands: Vec<Command>,
        slot: OwnedSemaphorePermit,
    ) -> Vec<Result<CommandResult, CoordError>> {
        let n = commands.len();
        let stats = &self.stats;
        let mut held = self.held.subscribe();
        let gate = loop {
            let gate = self.gate.clone().read_owned().await;
            if !*held.borrow_and_update() {
                break gate;
            }
            drop(gate);
            tokio::select! {
                _ = held.wait_for(|h| !*h) => {}
                () = self.leader.lost() => return Outcome::LeaderLost.results(n),
            }
        };
        stats.entries.fetch_add(1, Ordering::Relaxed);
        stats.commands.fetch_add(n as u64, Ordering::Relaxed);
        stats.progressed();
        let answer = match self
            .raft
            .client_write_ff(Proposal::new(now_ms(), commands))
            .await
        {
            Err(fatal) => {
                let e = || CoordError::Unavailable(format!("Raft has stopped: {fatal}"));
                return (0..n).map(|_| Err(e())).collect();
            }
            Ok(answer) => answer,
        };
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
        drop(gate);
        let outcome = tokio::select! {
            r = answer => Outcome::Answered(r),
            () = self.leader.lost() => {
                stats.abandoned_leader_lost.fetch_add(1, Ordering::Relaxed);
                Outcome::LeaderLost
            }
            () = tokio::time::sleep(COMMIT_PATIENCE) => {
                stats.abandoned_stuck.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    commands = n,
                    patience_ms = COMMIT_PATIENCE.as_millis(),
                    "an entry was not committed in time while this replica leads; its writes are driven again"
                );
                Outcome::Stuck
            }
        };
        stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        stats.progressed();
        drop(slot);
        outcome.results(n)
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

async fn run(waits: Waits, mut rx: mpsc::UnboundedReceiver<Pending>, slots: Arc<Semaphore>) {
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
        waits
            .stats
            .queued
            .fetch_sub(batch.len() as i64, Ordering::Relaxed);
        let (commands, replies): (Vec<_>, Vec<_>) =
            batch.into_iter().map(|p| (p.command, p.reply)).unzip();
        let waits = waits.clone();
        tokio::spawn(async move {
            for (reply, result) in replies.into_iter().zip(waits.commit(commands, slot).await) {
                let _ = reply.send(result);
            }
        });
    }
}

type WriteOutcome = Result<
    Result<
        openraft::raft::ClientWriteResponse<coord_raft_store::TypeConfig>,
        ClientWriteError<u64, openraft::BasicNode>,
    >,
    oneshot::error::RecvError,
>;

/// How the wait for an entry ended.
enum Outcome {
    /// openraft answered: applied, or refused or truncated with the leader to go to.
    Answered(WriteOutcome),
    /// This replica stopped leading first.
    LeaderLost,
    /// Not committed within [`COMMIT_PATIENCE`] although this replica still leads.
    Stuck,
}

impl Outcome {
    /// The result of each of the entry's `n` commands.
    fn results(self, n: usize) -> Vec<Result<CommandResult, CoordError>> {
        let each = |e: &dyn Fn() -> CoordError| (0..n).map(|_| Err(e())).collect();
        match self {
            Outcome::Answered(Ok(Ok(resp))) if resp.data.len() == n => {
                resp.data.into_iter().map(Ok).collect()
            }
            Outcome::Answered(Ok(Ok(resp))) => each(&|| {
                CoordError::Internal(format!(
                    "entry {} returned {} results for {n} commands",
                    resp.log_id,
                    resp.data.len()
                ))
            }),
            Outcome::Answered(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
                let leader = f.leader_id.zip(f.leader_node.map(|n| n.addr));
                each(&|| CoordError::NotLeader {
                    me: 0,
                    leader: leader.clone(),
                })
            }
            Outcome::Answered(Ok(Err(ClientWriteError::ChangeMembershipError(e)))) => {
                each(&|| CoordError::Internal(e.to_string()))
            }
            // The leader stepped down before the entry's fate was known here.
            Outcome::Answered(Err(_)) | Outcome::LeaderLost => each(&|| CoordError::LeaderChanged),
            Outcome::Stuck => each(&|| {
                CoordError::Unavailable(format!(
                    "the write was not committed within {} ms; its outcome is unknown",
                    COMMIT_PATIENCE.as_millis()
                ))
            }),
        }
    }
}

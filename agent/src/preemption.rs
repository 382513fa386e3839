//! Preemption sync (TensorFlow's `PreemptionSyncManager`): when one task learns that it will be
//! preempted, every task agrees on one step at which all of them checkpoint.
//!
//! The protocol, as TensorFlow's:
//!
//! 1. A [`PreemptionNotifier`] tells the task its death time; the task publishes it as
//!    [`NOTICE_KEY`] (RFC 3339). Every task listens for that key.
//! 2. Once the death time is within the protocol window (15 min by default), each task holds its
//!    step counter still, writes it to `PREEMPTION_CURRENT_COUNTER/<task>`, and waits at
//!    [`SYNC_BARRIER`] (3 min).
//! 3. After the barrier every task reads all counters; the sync point is the largest plus one.
//!    [`PreemptionSyncManager::reached_sync_point`] returns true exactly at that step.
//!
//! A failure midway (an unparsable death time, a counter that could not be written) cancels the
//! barrier, so that nobody waits; training goes on without a sync point. So does dropping a
//! task's [`PreemptionSyncManager`] while its round is before the barrier's outcome: that task
//! will never arrive, and its peers should not wait out the barrier's timeout.
//!
//! **Beyond TensorFlow: rounds.** In TensorFlow the service dies with the chief, so a job sees one
//! preemption. Here the service outlives every task, so the protocol must run again for the next
//! preemption, with tasks that restarted in between. Each round `r` uses barrier instance `r` of
//! [`SYNC_BARRIER`] and is recorded in the service: [`ROUND_KEY`] holds the number of finished
//! rounds. Every task that has computed the sync point counts itself in
//! `PREEMPTION_ROUND_FINISHED/<r>`; the last one records the round's notice as
//! [`LAST_NOTICE_KEY`], advances [`ROUND_KEY`], and clears the notice and the counters. A failed round is cleared by the first task that saw it fail (claimed in
//! [`CLEARED_DIR`]). A round whose death time passed long ago ([`PreemptionOptions::stale_after`]) is
//! cleared by whoever finds it, so a task that died mid-round cannot block the next one. A
//! restarted task that finds its own counter already written for the current round (its previous
//! run took part) does not take part again.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinHandle;
use tonic::{Code, Status};

use crate::agent::Agent;

mod notifier;
pub use notifier::{
    format_death_time, parse_death_time, ManualNotice, ManualNotifier, PreemptionNotifier,
    SigtermNotifier,
};

pub const NOTICE_KEY: &str = "RECEIVED_PREEMPTION_NOTICE";
pub const COUNTER_DIR: &str = "PREEMPTION_CURRENT_COUNTER";
pub const SYNC_BARRIER: &str = "PREEMPTION_SYNC_BARRIER";
/// coord's own: how many preemption rounds have finished.
pub const ROUND_KEY: &str = "PREEMPTION_ROUND";
/// coord's own: `<dir>/<round>` counts the tasks that computed that round's sync point.
pub const FINISHED_DIR: &str = "PREEMPTION_ROUND_FINISHED";
/// coord's own: `<dir>/<round>` exists once a task took on clearing that round.
pub const CLEARED_DIR: &str = "PREEMPTION_ROUND_CLEARED";
/// coord's own: the notice of the last finished round (a notice still there with this value is
/// being cleared, not a new one).
pub const LAST_NOTICE_KEY: &str = "PREEMPTION_LAST_NOTICE";

#[derive(Clone, Debug)]
pub struct PreemptionOptions {
    /// How long the sync barrier waits for every task (TensorFlow: 3 min).
    pub barrier_timeout: Duration,
    /// The protocol starts only once the death time is this close (TensorFlow: 15 min).
    pub protocol_window: Duration,
    /// A round whose death time passed this long ago is over, whatever its state.
    pub stale_after: Duration,
}

impl Default for PreemptionOptions {
    fn default() -> Self {
        Self {
            barrier_timeout: Duration::from_secs(180),
            protocol_window: Duration::from_secs(15 * 60),
            stale_after: Duration::from_secs(10 * 60),
        }
    }
}

/// The step counter and the agreed sync point, under one lock: while the protocol runs,
/// `reached_sync_point` waits, so the counter a task published cannot move underneath it.
#[derive(Default)]
struct Counters {
    call_counter: i64,
    sync_point: Option<i64>,
}

/// Whether this task owes round `round`'s sync barrier an arrival, shared by the protocol (which
/// records it) and the manager's `Drop` (which cancels the barrier instance for a task that will
/// never arrive). A `std` mutex: it is never held across an `.await`, and `Drop` cannot await.
#[derive(Default)]
struct Participation {
    /// The round from its notice until this task's barrier outcome is known and acted on.
    round: Option<u64>,
    /// The manager was dropped: the protocol must not enter another round, as nobody would
    /// cancel its barrier.
    dropped: bool,
}

type SharedParticipation = Arc<std::sync::Mutex<Participation>>;

fn participation(p: &SharedParticipation) -> std::sync::MutexGuard<'_, Participation> {
    p.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs the preemption sync protocol for one task. Dropping it stops the protocol; a round in
/// progress fails at once for the other tasks (CANCELLED at the sync barrier) instead of after
/// the barrier's timeout.
pub struct PreemptionSyncManager {
    counters: Arc<Mutex<Counters>>,
    tasks: Vec<JoinHandle<()>>,
    agent: Agent,
    participation: SharedParticipation,
}

impl Drop for PreemptionSyncManager {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        let round = {
            let mut p = participation(&self.participation);
            p.dropped = true;
            p.round.take()
        };
        let Some(round) = round else { return };
        // `Drop` cannot await the call; it runs on the runtime the agent's calls run on.
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let agent = self.agent.clone();
                rt.spawn(async move { cancel_sync_barrier(&agent, round).await });
            }
            Err(_) => tracing::warn!(
                round,
                "preemption sync manager dropped outside a tokio runtime; the other tasks wait for \
                 the sync barrier's timeout"
            ),
        }
    }
}

/// What the protocol reports as it goes (for logs and the demo's timeline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreemptionEvent {
    /// This task's notifier fired: it will be preempted at `death_time`.
    Notified { death_time: String },
    /// This task's notice was published (or another task's already was).
    NoticeSent { death_time: String },
    /// A notice (from any task) was seen; round `round` begins.
    NoticeReceived { round: u64, death_time: String },
    /// The sync point of round `round` was agreed.
    SyncPoint { round: u64, step: i64 },
    /// Round `round` failed; no sync point.
    Failed { round: u64, reason: String },
}

pub type EventSink = Arc<dyn Fn(PreemptionEvent) + Send + Sync>;

impl PreemptionSyncManager {
    /// Starts listening for notices from `notifier` and from the service. `agent` must be
    /// connected.
    pub fn start(
        agent: Agent,
        notifier: Box<dyn PreemptionNotifier>,
        options: PreemptionOptions,
        on_event: impl Fn(PreemptionEvent) + Send + Sync + 'static,
    ) -> Self {
        let on_event: EventSink = Arc::new(on_event);
        let counters = Arc::new(Mutex::new(Counters::default()));
        let participation = SharedParticipation::default();
        let (tx, rx) = mpsc::unbounded_channel();
        let notifier_task = notifier.start(tx);
        let publisher = tokio::spawn(publish_notices(agent.clone(), rx, on_event.clone()));
        let protocol = tokio::spawn(protocol_loop(Protocol {
            agent: agent.clone(),
            options,
            counters: counters.clone(),
            participation: participation.clone(),
            on_event,
        }));
        Self {
            counters,
            tasks: vec![notifier_task, publisher, protocol],
            agent,
            participation,
        }
    }

    /// Records that the task is at `step` and says whether this is the agreed sync point
    /// (TensorFlow's `ReachedSyncPoint`). Waits while the protocol is agreeing on it.
    pub async fn reached_sync_point(&self, step: i64) -> bool {
        let mut c = self.counters.lock().await;
        c.call_counter = step;
        c.sync_point == Some(step)
    }

    /// The agreed sync point of the latest round, if any.
    pub async fn sync_point(&self) -> Option<i64> {
        self.counters.lock().await.sync_point
    }
}

/// Publishes this task's notices. The first notice of a round wins; a later one finds the key
/// set and leaves it (the round is already under way), unless that notice is stale.
async fn publish_notices(
    agent: Agent,
    mut rx: mpsc::UnboundedReceiver<SystemTime>,
    on_event: EventSink,
) {
    while let Some(death) = rx.recv().await {
        let text = format_death_time(death);
        on_event(PreemptionEvent::Notified {
            death_time: text.clone(),
        });
        if publish(&agent, &text).await {
            on_event(PreemptionEvent::NoticeSent { death_time: text });
        }
    }
}

/// Publishes one notice. If a notice is already there and belongs to a live round, this task's
/// preemption is handled by that round; if it belongs to a round that is over (being cleared) or
/// is unreadable (about to fail and be cleared), waits for it to go and publishes again.
async fn publish(agent: &Agent, text: &str) -> bool {
    loop {
        match agent.insert_key_value(NOTICE_KEY, text.to_string()).await {
            Ok(()) => return true,
            Err(s) if s.code() == Code::AlreadyExists => {}
            Err(s) => {
                tracing::error!(error = %s, "could not publish the preemption notice");
                return false;
            }
        }
        let existing = agent.try_get_key_value(NOTICE_KEY).await.ok().flatten();
        let last = agent
            .try_get_key_value(LAST_NOTICE_KEY)
            .await
            .ok()
            .flatten();
        match existing {
            None => continue,
            Some(e)
                if Some(&e) != last.as_ref()
                    && parse_death_time(&String::from_utf8_lossy(&e)).is_ok() =>
            {
                tracing::info!(death_time = %text, "a preemption notice is already published");
                return true;
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

struct Protocol {
    agent: Agent,
    options: PreemptionOptions,
    counters: Arc<Mutex<Counters>>,
    participation: SharedParticipation,
    on_event: EventSink,
}

impl Protocol {
    /// Records that this task owes round `round`'s barrier an arrival; false once the manager is
    /// dropped.
    fn enter(&self, round: u64) -> bool {
        let mut p = participation(&self.participation);
        if !p.dropped {
            p.round = Some(round);
        }
        !p.dropped
    }

    /// This task's barrier outcome is known and acted on: a drop from now on cancels nothing.
    fn leave(&self) {
        participation(&self.participation).round = None;
    }
}

/// Fails instance `round` of the sync barrier for everyone, so nobody waits for a task that will
/// not arrive.
async fn cancel_sync_barrier(agent: &Agent, round: u64) {
    if let Err(s) = agent
        .client()
        .cancel_barrier(SYNC_BARRIER, round as i64, agent.task())
        .await
    {
        tracing::warn!(round, error = %s, "could not cancel the preemption sync barrier");
    }
}

fn counter_key(task: &coord_proto::tensorflow::CoordinatedTask) -> String {
    format!("{COUNTER_DIR}/job:{}/task:{}", task.job_name, task.task_id)
}

/// The outcome of one round for this task.
enum Round {
    /// Sync point agreed (and this task counted itself finished).
    Agreed,
    /// This task's earlier run already took part; only wait for the round to end.
    AlreadyIn,
    Failed(String),
}

async fn protocol_loop(p: Protocol) {
    loop {
        let round = match current_round(&p.agent).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the preemption round; retrying");
                tokio::time::sleep(crate::client::jittered(Duration::from_secs(1))).await;
                continue;
            }
        };
        // A blocking get: returns when some task publishes a notice.
        let notice = match p.agent.get_key_value(NOTICE_KEY, None).await {
            Ok(v) => String::from_utf8_lossy(&v).to_string(),
            Err(s) if s.code() == Code::Cancelled => return,
            Err(s) => {
                tracing::error!(error = %s, "failed to retrieve the preemption notice");
                cancel_sync_barrier(&p.agent, round).await;
                tokio::time::sleep(crate::client::jittered(Duration::from_secs(1))).await;
                continue;
            }
        };
        // A finished round's notice that is still being cleared is not a new one.
        let last = p
            .agent
            .try_get_key_value(LAST_NOTICE_KEY)
            .await
            .ok()
            .flatten();
        if last.as_deref() == Some(notice.as_bytes()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // The round may have ended between reading the round and the notice.
        if current_round(&p.agent).await.ok() != Some(round) {
            continue;
        }
        if !p.enter(round) {
            return;
        }
        (p.on_event)(PreemptionEvent::NoticeReceived {
            round,
            death_time: notice.clone(),
        });
        let outcome = match parse_death_time(&notice) {
            Err(e) => Round::Failed(e),
            Ok(death) => run_round(&p, round, &notice, death).await,
        };
        match outcome {
            Round::Agreed | Round::AlreadyIn => {}
            Round::Failed(reason) => {
                tracing::error!(round, %reason, "preemption sync failed");
                (p.on_event)(PreemptionEvent::Failed {
                    round,
                    reason: reason.clone(),
                });
                // Nobody waits at a barrier that cannot pass; then the round is over.
                cancel_sync_barrier(&p.agent, round).await;
                clear_round(&p.agent, round, &notice, false).await;
            }
        }
        p.leave();
        wait_round_over(&p, round, &notice).await;
    }
}

/// Finished rounds so far (the current round's number).
async fn current_round(agent: &Agent) -> Result<u64, Status> {
    match agent.try_get_key_value(ROUND_KEY).await? {
        None => Ok(0),
        Some(v) => std::str::from_utf8(&v)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| {
                Status::internal(format!("{ROUND_KEY} holds {v:?}, not a round number"))
            }),
    }
}

async fn run_round(p: &Protocol, round: u64, notice: &str, death: SystemTime) -> Round {
    // 1. Wait until the death time is within the protocol window.
    if let Ok(remaining) = death.duration_since(SystemTime::now()) {
        if remaining > p.options.protocol_window {
            let wait = remaining - p.options.protocol_window;
            tracing::info!(?wait, "preemption sync protocol begins later");
            tokio::time::sleep(wait).await;
        }
    }
    // 2. Hold the counter still and publish it.
    let mut counters = p.counters.lock().await;
    let key = counter_key(p.agent.task());
    match p
        .agent
        .insert_key_value(&key, counters.call_counter.to_string())
        .await
    {
        Ok(()) => {}
        Err(s) if s.code() == Code::AlreadyExists => {
            tracing::info!(
                round,
                "this task's counter is already published for this round (an earlier run took part)"
            );
            return Round::AlreadyIn;
        }
        Err(s) => return Round::Failed(format!("could not publish the call counter: {s}")),
    }
    // 3. Everybody's counter is in once the barrier passes.
    let task = p.agent.task().clone();
    if let Err(s) = p
        .agent
        .client()
        .barrier(
            SYNC_BARRIER,
            round as i64,
            p.options.barrier_timeout,
            &[],
            &task,
        )
        .await
    {
        return Round::Failed(format!("the sync barrier failed: {s}"));
    }
    // Passed: there is nothing left to cancel.
    p.leave();
    // 4-6. The sync point is the fastest task's next step.
    let all = match p.agent.get_key_value_dir(COUNTER_DIR).await {
        Ok(all) => all,
        Err(s) => return Round::Failed(format!("could not read the call counters: {s}")),
    };
    let mut max = None;
    for (k, v) in &all {
        let text = String::from_utf8_lossy(v);
        match text.trim().parse::<i64>() {
            Ok(n) => max = max.max(Some(n)),
            Err(_) => {
                return Round::Failed(format!("call counter {k:?} holds {text:?}, not a number"))
            }
        }
    }
    let Some(max) = max else {
        return Round::Failed("no call counters found".into());
    };
    counters.sync_point = Some(max + 1);
    drop(counters);
    tracing::info!(round, sync_point = max + 1, "preemption sync point agreed");
    (p.on_event)(PreemptionEvent::SyncPoint {
        round,
        step: max + 1,
    });
    // The last task to get here clears the round for the next one.
    let tasks = match p.agent.client().task_states(&[]).await {
        Ok(r) => r.tasks.len() as i64,
        Err(_) => i64::MAX,
    };
    match p
        .agent
        .increment_key_value(&format!("{FINISHED_DIR}/{round}"), 1)
        .await
    {
        Ok(n) if n >= tasks => clear_round(&p.agent, round, notice, false).await,
        Ok(_) => {}
        Err(s) => tracing::warn!(error = %s, "could not count this task finished"),
    }
    Round::Agreed
}

/// Ends round `round` (whose notice was `notice`): first the record of its notice, then the next
/// round's number, then the round's keys, so that whoever sees the notice still there knows it is
/// old, and whoever sees a new notice also sees the new number. The first task to claim the round
/// does it (`force`: regardless of claims, for a round whose clearer died).
async fn clear_round(agent: &Agent, round: u64, notice: &str, force: bool) {
    // One task clears each round: a late one (that saw the round fail after the others moved on)
    // must not delete the next round's notice or counters.
    if !force {
        match agent
            .insert_key_value(&format!("{CLEARED_DIR}/{round}"), "1")
            .await
        {
            Ok(()) => {}
            Err(s) if s.code() == Code::AlreadyExists => return,
            Err(s) => {
                tracing::warn!(error = %s, "could not claim the clearing of the round");
                return;
            }
        }
    }
    if let Err(s) = agent
        .update_key_value(LAST_NOTICE_KEY, notice.to_string())
        .await
    {
        tracing::warn!(error = %s, "could not record the finished round's notice");
        return;
    }
    let next = (round + 1).to_string();
    if let Err(s) = agent.update_key_value(ROUND_KEY, next).await {
        tracing::warn!(error = %s, "could not advance the preemption round");
        return;
    }
    for key in [COUNTER_DIR.to_string(), NOTICE_KEY.to_string()] {
        if let Err(s) = agent.delete_key_value(&key).await {
            tracing::warn!(error = %s, %key, "could not clear the finished round");
        }
    }
}

/// Waits until round `round` is over (another task cleared it), clearing it itself once its death
/// time is long past.
async fn wait_round_over(p: &Protocol, round: u64, notice: &str) {
    let stale_at = parse_death_time(notice)
        .ok()
        .map(|d| d + p.options.stale_after);
    loop {
        match current_round(&p.agent).await {
            Ok(r) if r > round => return,
            _ => {}
        }
        if stale_at.is_some_and(|t| SystemTime::now() > t) {
            tracing::warn!(
                round,
                "preemption round outlived its death time; clearing it"
            );
            clear_round(&p.agent, round, notice, true).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn death_times_round_trip_and_accept_offsets() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_nanos(1_790_000_000_123_456_789);
        let s = format_death_time(t);
        // As absl::FormatTime writes UTC.
        assert!(s.ends_with("+00:00"), "{s}");
        assert_eq!(parse_death_time(&s), Ok(t));
        assert_eq!(
            parse_death_time("2026-11-21T23:59:00+01:00"),
            parse_death_time("2026-11-21T22:59:00Z")
        );
        assert!(parse_death_time("tomorrow").is_err());
    }
}

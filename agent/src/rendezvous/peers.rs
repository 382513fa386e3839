//! Peer heartbeats on the worker links.
//!
//! Each watched peer gets a probe every `interval`. A peer is declared dead when it has not answered
//! for `timeout` after it last did, or when it answers with a new incarnation (it restarted, and
//! whatever it held is gone). Declaring it dead fails at once every receive waiting on it (through
//! [`Links::declare_dead`]) and tells the callback, which the agent uses to report the error to the
//! coordination service.
//!
//! A peer is watched from its first answer on: one that has not come up yet is not dead, it is
//! late, and the coordination service's own registration timeout covers a task that never starts.
//! The probes go worker to worker and need no coordinator, so they keep running while the ensemble
//! elects a leader.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use super::links::Links;
use super::RendezvousError;

#[derive(Clone, Debug)]
pub struct PeerOptions {
    pub interval: Duration,
    /// Silence after the last answer that makes a peer dead.
    pub timeout: Duration,
}

impl Default for PeerOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(1500),
        }
    }
}

/// What happened to a watched peer.
#[derive(Clone, Debug)]
pub enum PeerEvent {
    /// It answered for the first time: from now on it is watched.
    Up { task: String, incarnation: u64 },
    /// It was declared dead (once).
    Dead {
        task: String,
        error: RendezvousError,
    },
}

/// Told about every [`PeerEvent`].
pub type OnPeer = Arc<dyn Fn(&PeerEvent) + Send + Sync>;

/// Every task of `job` as the coordination service knows it (its cluster configuration): the
/// default set of peers a worker watches.
pub async fn job_tasks(
    client: &crate::client::CoordClient,
    job: &str,
) -> Result<Vec<String>, tonic::Status> {
    let reply = client.tasks().await?;
    Ok(reply
        .tasks
        .iter()
        .filter(|t| t.job == job)
        .map(|t| super::key::task_name(job, 0, t.task))
        .collect())
}

/// Watches peers until dropped.
pub struct PeerMonitor {
    probes: Vec<JoinHandle<()>>,
}

impl PeerMonitor {
    /// Starts watching `peers` from task `me`.
    pub fn start(
        links: Links,
        me: String,
        peers: Vec<String>,
        options: PeerOptions,
        on_event: OnPeer,
    ) -> Self {
        let probes = peers
            .into_iter()
            .filter(|p| *p != me)
            .map(|peer| {
                tokio::spawn(watch(
                    links.clone(),
                    me.clone(),
                    peer,
                    options.clone(),
                    on_event.clone(),
                ))
            })
            .collect();
        Self { probes }
    }
}

impl Drop for PeerMonitor {
    fn drop(&mut self) {
        for p in &self.probes {
            p.abort();
        }
    }
}

async fn watch(links: Links, me: String, peer: String, options: PeerOptions, on_event: OnPeer) {
    let mut last_answer: Option<(Instant, u64)> = None;
    loop {
        let started = Instant::now();
        // A probe never waits past the moment the peer would be dead, so that a hung peer is
        // found as soon as a refused connection.
        let deadline = last_answer.map(|(at, _)| at + options.timeout);
        let wait = deadline.map_or(options.interval, |d| {
            d.saturating_duration_since(started)
                .clamp(Duration::from_millis(10), options.interval)
        });
        let probe = tokio::time::timeout(wait, links.heartbeat(&peer, &me, wait))
            .await
            .unwrap_or_else(|_| {
                Err(RendezvousError::unavailable(format!(
                    "{peer} did not answer within {wait:?}"
                )))
            });
        let answered = probe.is_ok();
        let death = match (probe, last_answer) {
            (Ok(incarnation), Some((_, known))) if incarnation != known => Some(
                RendezvousError::aborted(format!(
                    "peer {peer} restarted (incarnation {known:#x} is now {incarnation:#x}); what it held is gone"
                )),
            ),
            (Ok(incarnation), previous) => {
                if previous.is_none() {
                    on_event(&PeerEvent::Up {
                        task: peer.clone(),
                        incarnation,
                    });
                }
                last_answer = Some((Instant::now(), incarnation));
                None
            }
            (Err(e), Some((at, _))) if at.elapsed() >= options.timeout => {
                Some(RendezvousError::unavailable(format!(
                    "peer {peer} is dead: no heartbeat answer for {:.1} s (last error: {})",
                    at.elapsed().as_secs_f64(),
                    e.message
                )))
            }
            (Err(e), _) => {
                tracing::debug!(%peer, error = %e.message, "peer heartbeat failed");
                None
            }
        };
        if let Some(error) = death {
            tracing::warn!(%peer, error = %error.message, "peer declared dead");
            links.declare_dead(&peer, error.clone());
            on_event(&PeerEvent::Dead { task: peer, error });
            return;
        }
        let mut next = started + options.interval;
        if let (false, Some(d)) = (answered, deadline) {
            next = next.min(d.max(Instant::now()));
        }
        tokio::time::sleep_until(next.into()).await;
    }
}

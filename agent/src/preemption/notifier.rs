//! Where preemption notices come from (SIGTERM, or the program itself), and death times as
//! TensorFlow writes them.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Learns that this task will be preempted, and when.
pub trait PreemptionNotifier: Send + 'static {
    /// Starts listening; sends each death time to `notices`.
    fn start(self: Box<Self>, notices: mpsc::UnboundedSender<SystemTime>) -> JoinHandle<()>;
}

/// SIGTERM means preemption: death time = now + `grace` (a cloud VM's shutdown notice, or
/// Kubernetes' termination grace period).
pub struct SigtermNotifier {
    pub grace: Duration,
}

impl PreemptionNotifier for SigtermNotifier {
    fn start(self: Box<Self>, notices: mpsc::UnboundedSender<SystemTime>) -> JoinHandle<()> {
        // Installed before `start` returns: from then on SIGTERM no longer kills the process.
        let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
        tokio::spawn(async move {
            let mut term = match term {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM; preemption notices will not arrive");
                    return;
                }
            };
            while term.recv().await.is_some() {
                tracing::info!(grace = ?self.grace, "SIGTERM: this task will be preempted");
                if notices.send(SystemTime::now() + self.grace).is_err() {
                    return;
                }
            }
        })
    }
}

/// A notifier driven by the program (tests, or an integration with a cloud's metadata server).
pub struct ManualNotifier {
    rx: mpsc::UnboundedReceiver<SystemTime>,
}

/// Sends notices to a [`ManualNotifier`].
#[derive(Clone)]
pub struct ManualNotice(mpsc::UnboundedSender<SystemTime>);

impl ManualNotice {
    pub fn notify(&self, death_time: SystemTime) {
        let _ = self.0.send(death_time);
    }
}

impl ManualNotifier {
    pub fn new() -> (Self, ManualNotice) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { rx }, ManualNotice(tx))
    }
}

impl PreemptionNotifier for ManualNotifier {
    fn start(mut self: Box<Self>, notices: mpsc::UnboundedSender<SystemTime>) -> JoinHandle<()> {
        tokio::spawn(async move {
            while let Some(t) = self.rx.recv().await {
                if notices.send(t).is_err() {
                    return;
                }
            }
        })
    }
}

/// A death time as TensorFlow writes it (RFC 3339, UTC as `+00:00`, with nanoseconds).
pub fn format_death_time(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339_opts(SecondsFormat::Nanos, false)
}

/// Parses an RFC 3339 death time (any offset).
pub fn parse_death_time(s: &str) -> Result<SystemTime, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(SystemTime::from)
        .map_err(|e| format!("death time {s:?} is not RFC 3339: {e}"))
}

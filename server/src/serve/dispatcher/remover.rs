//! MaybeRemoveTask's agreement (TensorFlow's `TaskRemover`): a round-robin task may leave only
//! when every consumer asks to remove it at the same round, since they all read round r from
//! task r mod n. Each request waits (up to [`WAIT`]) for the others; a request for another round
//! spoils the attempt for everyone waiting. Leader memory: a new leader starts a new attempt.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long a consumer's request waits for the others (TF: 10 s).
pub const WAIT: Duration = Duration::from_secs(10);

pub struct TaskRemover {
    consumers: usize,
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Default)]
struct State {
    /// The round the consumers waiting now agree on; `None` once spoiled or done.
    round: Option<i64>,
    waiting: HashSet<i64>,
    removed: bool,
}

impl TaskRemover {
    pub fn new(consumers: i64) -> Self {
        Self {
            consumers: usize::try_from(consumers).unwrap_or(usize::MAX),
            state: Mutex::default(),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the task is removed: true once every consumer asked for `round` within `wait`.
    pub async fn request_removal(&self, consumer: i64, round: i64, wait: Duration) -> bool {
        {
            let mut g = self.lock();
            if g.waiting.is_empty() {
                g.round = Some(round);
            }
            if g.round != Some(round) {
                g.round = None;
                self.changed.notify_waiters();
                return false;
            }
            g.waiting.insert(consumer);
        }
        let deadline = Instant::now() + wait;
        let removed = loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut g = self.lock();
                if g.removed {
                    break true;
                }
                if g.waiting.len() >= self.consumers {
                    g.removed = true;
                    g.round = None;
                    self.changed.notify_waiters();
                    break true;
                }
                if g.round != Some(round) {
                    break false;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break self.lock().removed;
            }
        };
        self.lock().waiting.remove(&consumer);
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_consumer_at_the_same_round_removes_the_task() {
        let r = std::sync::Arc::new(TaskRemover::new(2));
        let a = {
            let r = r.clone();
            tokio::spawn(async move { r.request_removal(0, 5, WAIT).await })
        };
        tokio::task::yield_now().await;
        assert!(r.request_removal(1, 5, WAIT).await);
        assert!(a.await.expect("join"));
    }

    #[tokio::test]
    async fn another_round_spoils_the_attempt_and_a_lone_consumer_times_out() {
        let r = std::sync::Arc::new(TaskRemover::new(2));
        let a = {
            let r = r.clone();
            tokio::spawn(async move { r.request_removal(0, 5, WAIT).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!r.request_removal(1, 6, WAIT).await);
        assert!(!a.await.expect("join"));
        assert!(!r.request_removal(0, 7, Duration::from_millis(20)).await);
    }
}

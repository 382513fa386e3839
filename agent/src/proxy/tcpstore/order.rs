//! The order of torch's reply-less writes across the proxy's connections.
//!
//! SET, MULTI_SET, APPEND and QUEUE_PUSH have no answer: torch's client sends one and goes on at
//! once, and its own server, one thread reading its sockets in turn, applies it before anything
//! that reaches it later. A process that writes on one store object and then reads on another
//! (or tells a second process to) finds the write there. Here a write takes a Raft commit, so a
//! later request of another connection could overtake it. So every request received after a
//! reply-less write waits until that write is committed: the proxy's connections see the
//! reply-less writes in the order they reached it, as torch's server would. (Writes that answer
//! are awaited by their client anyway.)

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

#[derive(Default)]
pub struct WriteOrder {
    state: Mutex<State>,
    done: Notify,
}

#[derive(Default)]
struct State {
    /// The next receipt number.
    next: u64,
    /// Receipt numbers of reply-less writes not yet committed.
    pending: BTreeSet<u64>,
}

/// A reply-less write in flight; done when dropped (committed, refused or abandoned).
pub struct Pending {
    order: Arc<WriteOrder>,
    receipt: u64,
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.order.lock().pending.remove(&self.receipt);
        self.order.done.notify_waiters();
    }
}

impl WriteOrder {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a request just received: its receipt number, and for a reply-less write the
    /// guard that keeps later requests waiting until it is dropped.
    pub fn receive(self: &Arc<Self>, reply_less: bool) -> (u64, Option<Pending>) {
        let mut s = self.lock();
        let receipt = s.next;
        s.next += 1;
        let pending = reply_less.then(|| {
            s.pending.insert(receipt);
            Pending {
                order: self.clone(),
                receipt,
            }
        });
        (receipt, pending)
    }

    /// Waits until every reply-less write received before `receipt` is done.
    pub async fn earlier_done(&self, receipt: u64) {
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.lock().pending.first().is_none_or(|&p| p >= receipt) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_request_waits_for_earlier_reply_less_writes_only() {
        let order = Arc::new(WriteOrder::default());
        let (_, first) = order.receive(true);
        let (read, none) = order.receive(false);
        assert!(none.is_none());
        let (_, later) = order.receive(true);
        let waiting = tokio::time::timeout(Duration::from_millis(50), order.earlier_done(read));
        assert!(waiting.await.is_err(), "the earlier write is still pending");
        drop(first);
        // The later write does not hold back an earlier request.
        tokio::time::timeout(Duration::from_secs(5), order.earlier_done(read))
            .await
            .expect("released once the earlier write is done");
        drop(later);
    }
}

//! The in-process rendezvous of one step: a table from key to either sent tensors not yet received
//! or receivers still waiting, as TensorFlow's `LocalRendezvous`.
//!
//! `send` never blocks: it hands the tensor to the first waiting receiver or queues it. Each send
//! is matched with exactly one receive, in order, per key. `start_abort` fails every waiting
//! receiver and every later call with the abort's error, and drops what was queued.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};

use tokio::sync::oneshot;

use super::{ParsedKey, RendezvousError, Tensor};

/// What a receive gets: the tensor, and TensorFlow's dead-tensor flag (control flow).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub tensor: Tensor,
    pub is_dead: bool,
}

/// A waiting receive. An abort drops it; the receiver then reads the abort's error from the table.
type Waiter = oneshot::Sender<Received>;

enum Slot {
    Sent(VecDeque<Received>),
    Waiting(VecDeque<Waiter>),
}

#[derive(Default)]
struct Table {
    slots: HashMap<String, Slot>,
    aborted: Option<RendezvousError>,
}

#[derive(Default)]
pub struct LocalRendezvous {
    table: Mutex<Table>,
}

impl LocalRendezvous {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Nothing panics while holding the lock; a poisoned table is still consistent.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `tensor` to the first receiver waiting for `key`, or queues it.
    pub fn send(
        &self,
        key: &ParsedKey,
        tensor: Tensor,
        is_dead: bool,
    ) -> Result<(), RendezvousError> {
        let mut table = self.lock();
        if let Some(e) = &table.aborted {
            return Err(e.clone());
        }
        let mut item = Received { tensor, is_dead };
        if let Some(Slot::Waiting(waiters)) = table.slots.get_mut(key.as_str()) {
            // A receiver that gave up (its future dropped) gives the tensor back.
            while let Some(w) = waiters.pop_front() {
                match w.send(item) {
                    Ok(()) => {
                        if waiters.is_empty() {
                            table.slots.remove(key.as_str());
                        }
                        return Ok(());
                    }
                    Err(back) => item = back,
                }
            }
            table.slots.remove(key.as_str());
        }
        match table
            .slots
            .entry(key.as_str().to_string())
            .or_insert_with(|| Slot::Sent(VecDeque::new()))
        {
            Slot::Sent(q) => q.push_back(item),
            // Emptied and removed above, so not reachable with waiters left.
            Slot::Waiting(_) => {}
        }
        Ok(())
    }

    /// Waits for the tensor `key`: at once if it was sent, else until it is (or the rendezvous
    /// is aborted). Dropping the future gives up the receive.
    pub async fn recv(&self, key: &ParsedKey) -> Result<Received, RendezvousError> {
        let rx = {
            let mut table = self.lock();
            if let Some(e) = &table.aborted {
                return Err(e.clone());
            }
            if let Some(Slot::Sent(q)) = table.slots.get_mut(key.as_str()) {
                let item = q.pop_front();
                if q.is_empty() {
                    table.slots.remove(key.as_str());
                }
                if let Some(item) = item {
                    return Ok(item);
                }
            }
            let (tx, rx) = oneshot::channel();
            match table
                .slots
                .entry(key.as_str().to_string())
                .or_insert_with(|| Slot::Waiting(VecDeque::new()))
            {
                Slot::Waiting(w) => w.push_back(tx),
                Slot::Sent(_) => {}
            }
            rx
        };
        match rx.await {
            Ok(item) => Ok(item),
            Err(_) => Err(self.lock().aborted.clone().unwrap_or_else(|| {
                RendezvousError::cancelled(format!("the receive of {key} was dropped"))
            })),
        }
    }

    /// Fails every waiting receive and every later call with `error`; drops queued tensors.
    /// The first abort's error is the one reported.
    pub fn start_abort(&self, error: RendezvousError) {
        let slots = {
            let mut table = self.lock();
            if table.aborted.is_none() {
                table.aborted = Some(error);
            }
            std::mem::take(&mut table.slots)
        };
        // Dropped outside the lock: each waiter wakes and reads the error from the table.
        drop(slots);
    }

    /// Keys with a queued tensor or a waiting receiver (for tests and leak checks).
    pub fn pending(&self) -> usize {
        self.lock().slots.len()
    }
}

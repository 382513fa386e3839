//! Key watches: every applied key-value change, kept for a while and fanned out live.
//!
//! Every replica records the changes it applies (all replicas apply the same log, so revisions
//! agree), in a bounded history and on a broadcast channel. A watch starts by subscribing, then
//! replays history from its start revision, then follows the channel, skipping revisions it has
//! already sent: nothing slips between the replay and the live feed. A watcher that reconnects to a
//! new leader with "last revision seen + 1" gets every later change exactly once, as long as the
//! new leader still holds it in history; otherwise it is told OUT_OF_RANGE.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use tokio::sync::broadcast;

/// History keeps at most this many changes...
const HISTORY_EVENTS: usize = 64 * 1024;
/// ...and at most this many bytes of keys and values.
const HISTORY_BYTES: usize = 64 << 20;
/// Live batches a slow watcher may fall behind before it is cut off (it then resumes from
/// history).
const LIVE_BACKLOG: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Delete,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEvent {
    pub kind: EventKind,
    pub key: String,
    pub value: Bytes,
    pub revision: u64,
}

impl KvEvent {
    fn size(&self) -> usize {
        self.key.len() + self.value.len() + 48
    }

    /// Whether a watch of `key` (the key itself and everything under `key/`) sees this event.
    pub fn concerns(&self, key: &str) -> bool {
        self.key == key
            || (self.key.len() > key.len()
                && self.key.starts_with(key)
                && self.key.as_bytes()[key.len()] == b'/')
    }
}

/// The start revision is older than the history kept.
#[derive(Debug, PartialEq, Eq)]
pub struct Compacted {
    /// The oldest revision that can still be watched from.
    pub oldest: u64,
}

pub struct WatchHub {
    history: Mutex<History>,
    live: broadcast::Sender<Arc<[KvEvent]>>,
    /// Watch streams being served, for metrics.
    pub active: std::sync::atomic::AtomicI64,
}

struct History {
    events: VecDeque<KvEvent>,
    bytes: usize,
    /// Every change with a revision above this is in `events` (or not applied yet).
    floor: u64,
}

impl Default for WatchHub {
    fn default() -> Self {
        Self {
            history: Mutex::new(History {
                events: VecDeque::new(),
                bytes: 0,
                floor: 0,
            }),
            live: broadcast::channel(LIVE_BACKLOG).0,
            active: std::sync::atomic::AtomicI64::new(0),
        }
    }
}

impl WatchHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, History> {
        self.history.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts history at `revision`: the state was loaded (or replaced) with every change up to it
    /// already applied.
    pub fn restart_at(&self, revision: u64) {
        let mut h = self.lock();
        h.events.clear();
        h.bytes = 0;
        h.floor = revision;
    }

    /// Records changes just applied, in revision order, and sends them to live watchers.
    pub fn record(&self, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        {
            let mut h = self.lock();
            for e in &events {
                h.bytes += e.size();
                h.events.push_back(e.clone());
            }
            while h.events.len() > HISTORY_EVENTS || h.bytes > HISTORY_BYTES {
                let Some(old) = h.events.pop_front() else {
                    break;
                };
                h.bytes -= old.size();
                h.floor = old.revision;
            }
        }
        // No receiver is fine: nobody watches.
        let _ = self.live.send(events.into());
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<[KvEvent]>> {
        self.live.subscribe()
    }

    /// Recorded changes from revision `start` on that concern `key`.
    pub fn since(&self, start: u64, key: &str) -> Result<Vec<KvEvent>, Compacted> {
        let h = self.lock();
        if start <= h.floor {
            return Err(Compacted {
                oldest: h.floor + 1,
            });
        }
        Ok(h.events
            .iter()
            .filter(|e| e.revision >= start && e.concerns(key))
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(key: &str, revision: u64) -> KvEvent {
        KvEvent {
            kind: EventKind::Put,
            key: key.into(),
            value: Bytes::new(),
            revision,
        }
    }

    #[test]
    fn a_watch_covers_the_key_and_its_subtree_only() {
        for (k, yes) in [
            ("a", true),
            ("a/b", true),
            ("a/b/c", true),
            ("ab", false),
            ("b", false),
            ("a0", false),
        ] {
            assert_eq!(put(k, 1).concerns("a"), yes, "{k}");
        }
    }

    #[test]
    fn replay_from_history_and_compaction() {
        let hub = WatchHub::default();
        hub.restart_at(10);
        hub.record(vec![put("a/1", 11), put("b", 12), put("a/2", 13)]);
        let got: Vec<u64> = hub
            .since(12, "a")
            .expect("in history")
            .iter()
            .map(|e| e.revision)
            .collect();
        assert_eq!(got, vec![13]);
        assert_eq!(hub.since(10, "a"), Err(Compacted { oldest: 11 }));
        assert_eq!(hub.since(11, "a").map(|v| v.len()), Ok(2));
    }

    #[tokio::test]
    async fn live_watchers_get_recorded_batches() {
        let hub = WatchHub::default();
        let mut rx = hub.subscribe();
        hub.record(vec![put("x", 1)]);
        let batch = rx.recv().await.expect("batch");
        assert_eq!(batch[0].revision, 1);
    }
}

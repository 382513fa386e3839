//! Key watches of the agent (TensorFlow's StartWatchKey/StopWatchKey, which TF never
//! implemented).
//!
//! Each watched key has one task that holds a `coord.kv.KeyValue/Watch` stream on the leader. The
//! first message says from which revision the watch runs; every event carries its revision, and
//! the task remembers the next revision it owes the callback. When the stream breaks (the leader
//! died or lost leadership), the task opens a new one on the new leader from that revision, so the
//! callback sees every change exactly once, in commit order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coord_proto::coord::kv::watch_event::Kind;
use tokio::task::JoinHandle;
use tonic::{Code, Status};

use crate::client::CoordClient;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Put,
    Delete,
}

/// One change to a watched key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyChange {
    pub kind: ChangeKind,
    pub key: String,
    /// The new value of a put; empty for a delete.
    pub value: Bytes,
    /// The store's revision of the change; increasing across all keys.
    pub revision: u64,
}

pub type WatchCallback = Arc<dyn Fn(Result<Vec<KeyChange>, Status>) + Send + Sync>;

/// A watch whose streams keep breaking without delivering anything for this long gives up.
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);

/// The watches of one agent; dropping it stops them.
pub struct WatchSet {
    client: CoordClient,
    running: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl WatchSet {
    pub fn new(client: CoordClient) -> Self {
        Self {
            client,
            running: Mutex::new(HashMap::new()),
        }
    }

    pub fn start(&self, key: &str, callback: WatchCallback) -> Result<(), Status> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        running.retain(|_, h| !h.is_finished());
        if running.contains_key(key) {
            return Err(Status::already_exists(format!(
                "key {key:?} is already watched"
            )));
        }
        let task = tokio::spawn(follow(self.client.clone(), key.to_string(), callback));
        running.insert(key.to_string(), task);
        Ok(())
    }

    pub fn stop(&self, key: &str) -> Result<(), Status> {
        match self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
        {
            Some(h) => {
                h.abort();
                Ok(())
            }
            None => Err(Status::not_found(format!("key {key:?} is not watched"))),
        }
    }

    pub fn stop_all(&self) {
        for (_, h) in self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
        {
            h.abort();
        }
    }
}

impl Drop for WatchSet {
    fn drop(&mut self) {
        self.stop_all();
    }
}

fn change_of(e: coord_proto::coord::kv::WatchEvent) -> KeyChange {
    KeyChange {
        kind: if e.kind == Kind::Delete as i32 {
            ChangeKind::Delete
        } else {
            ChangeKind::Put
        },
        key: e.key,
        value: e.value,
        revision: e.revision,
    }
}

/// Follows `key` across streams until an error that resuming cannot fix.
async fn follow(client: CoordClient, key: String, callback: WatchCallback) {
    // The next revision the callback is owed; 0 until the first stream says where it starts.
    let mut next: u64 = 0;
    let mut broken_since: Option<Instant> = None;
    loop {
        let mut stream = match client.open_watch(&key, next).await {
            Ok(s) => s,
            // The client already retried for its whole deadline.
            Err(e) => return callback(Err(e)),
        };
        let ended = loop {
            match stream.message().await {
                Ok(Some(msg)) => {
                    broken_since = None;
                    if next == 0 {
                        next = msg.started_after + 1;
                    }
                    let changes: Vec<KeyChange> = msg
                        .events
                        .into_iter()
                        .filter(|e| e.revision >= next)
                        .map(change_of)
                        .collect();
                    if let Some(last) = changes.last() {
                        next = last.revision + 1;
                        callback(Ok(changes));
                    }
                }
                Ok(None) => break Status::unavailable("the watch stream ended"),
                Err(e) => break e,
            }
        };
        let resumable = matches!(
            ended.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        );
        if !resumable {
            return callback(Err(ended));
        }
        let since = *broken_since.get_or_insert_with(Instant::now);
        if since.elapsed() > GIVE_UP_AFTER {
            return callback(Err(ended));
        }
        tracing::debug!(%key, next, error = %ended, "watch stream broke; resuming");
        tokio::time::sleep(crate::client::jittered(Duration::from_millis(20))).await;
    }
}

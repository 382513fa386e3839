//! The key-value semantics, written once for every wire surface (TensorFlow's now, XLA's later).
//!
//! Everything here runs on the leader (routing guarantees it): writes go through the
//! [`Proposer`], reads wait for the [`ReadIndex`] and then read the applied state.

use std::sync::Arc;

use bytes::Bytes;
use coord_raft_store::key::normalize_key;
use coord_raft_store::{Command, Op, Output, RequestId};

use crate::error::CoordError;
use crate::serve::apply_hub::KvWaiters;
use crate::serve::namespace::{self, NsReader};
use crate::serve::parked::Wake;
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;

/// Size limits on keys and values, and the most keys the store holds (0: no limit).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
    pub max_keys: u64,
}

pub struct KvCore {
    pub proposer: Proposer,
    pub read_index: ReadIndex,
    /// Reads the namespace of the call.
    pub reader: NsReader,
    pub parked: Arc<KvWaiters>,
    pub limits: Limits,
}

/// Shortens a key for an error message without splitting a character.
fn shown(key: &str) -> String {
    if key.len() <= 64 {
        return key.to_string();
    }
    let mut end = 64;
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &key[..end])
}

impl KvCore {
    /// Normalizes `raw` and checks it against the limits; `what` names the field in errors.
    pub fn check_key(&self, raw: &str, what: &str) -> Result<String, CoordError> {
        let key = normalize_key(raw);
        if key.is_empty() {
            return Err(CoordError::InvalidArgument(format!(
                "{what} must not be empty (got {raw:?})"
            )));
        }
        if key.len() > self.limits.max_key_bytes {
            return Err(CoordError::InvalidArgument(format!(
                "{what} {:?} is {} bytes; the limit is {}",
                shown(&key),
                key.len(),
                self.limits.max_key_bytes
            )));
        }
        Ok(key)
    }

    async fn commit(&self, request: Option<RequestId>, op: Op) -> Result<Output, CoordError> {
        let result = self.proposer.propose(Command { request, op }).await?;
        Ok(result?)
    }

    pub async fn insert(
        &self,
        id: Option<RequestId>,
        raw_key: &str,
        value: Bytes,
        overwrite: bool,
    ) -> Result<(), CoordError> {
        let key = self.check_key(raw_key, "key")?;
        if value.len() > self.limits.max_value_bytes {
            return Err(CoordError::InvalidArgument(format!(
                "value of key {:?} is {} bytes; the limit is {}",
                shown(&key),
                value.len(),
                self.limits.max_value_bytes
            )));
        }
        self.check_room(&key)?;
        let op = Op::KvPut {
            key,
            value,
            overwrite,
        };
        self.check_quota(&op)?;
        self.commit(id, op).await?;
        Ok(())
    }

    /// While the quota alarm is up, refuses a write the quota would refuse, before proposing it
    /// (the first refused write is committed: that raises the alarm on every replica).
    fn check_quota(&self, op: &Op) -> Result<(), CoordError> {
        let ns = namespace::current();
        self.reader.all().read(|a| {
            a.state
                .refusal_while_alarmed(ns.as_deref(), op)
                .map_or(Ok(()), |e| Err(e.into()))
        })
    }

    /// Refuses a new key when the store is full (`--max-keys`). An existing key may always be
    /// written. Checked against the applied state before proposing.
    fn check_room(&self, key: &str) -> Result<(), CoordError> {
        let max = self.limits.max_keys;
        if max == 0 {
            return Ok(());
        }
        let (exists, count) = self
            .reader
            .read(|a| (a.state.kv.get(key).is_some(), a.state.kv.len() as u64));
        if exists || count < max {
            return Ok(());
        }
        Err(CoordError::ResourceExhausted(format!(
            "the store holds {count} keys, its limit (--max-keys {max}); new key {:?} refused",
            shown(key)
        )))
    }

    /// Deletes the key and everything under `key/`; returns how many keys went.
    pub async fn delete(&self, id: Option<RequestId>, raw_key: &str) -> Result<u64, CoordError> {
        let key = self.check_key(raw_key, "key")?;
        match self.commit(id, Op::KvDelete { key }).await? {
            Output::Deleted(n) => Ok(n),
            other => Err(CoordError::Internal(format!("delete returned {other:?}"))),
        }
    }

    /// Adds `delta` to the decimal integer at the key (0 if missing); returns the new value.
    pub async fn increment(
        &self,
        id: Option<RequestId>,
        raw_key: &str,
        delta: i64,
    ) -> Result<Bytes, CoordError> {
        let key = self.check_key(raw_key, "key")?;
        self.check_room(&key)?;
        let op = Op::KvIncrement { key, delta };
        self.check_quota(&op)?;
        match self.commit(id, op).await? {
            Output::Value(v) => Ok(v),
            other => Err(CoordError::Internal(format!(
                "increment returned {other:?}"
            ))),
        }
    }

    /// The value of the key, or NOT_FOUND; linearizable.
    pub async fn try_get(&self, raw_key: &str) -> Result<(String, Bytes), CoordError> {
        let key = self.check_key(raw_key, "key")?;
        self.read_index.linearize().await?;
        let value = self
            .reader
            .read(|a| a.state.kv.get(&key).map(|e| e.value.clone()));
        match value {
            Some(v) => Ok((key, v)),
            None => Err(CoordError::NotFound { key }),
        }
    }

    /// The value of the key, waiting for it to be inserted if it does not exist yet. The caller's
    /// deadline (or cancellation) bounds the wait.
    pub async fn get(&self, raw_key: &str) -> Result<(String, Bytes), CoordError> {
        let key = self.check_key(raw_key, "key")?;
        // Taken before leadership is confirmed: if it is lost any time after, parking fails.
        let epoch = self.parked.epoch();
        self.read_index.linearize().await?;
        let mut slot = None;
        loop {
            let found = self.reader.read(|a| match a.state.kv.get(&key) {
                Some(e) => Ok(e.value.clone()),
                None => Err(self.parked.park(&key, epoch, &mut slot)),
            });
            let mut parked = match found {
                Ok(v) => return Ok((key, v)),
                Err(Ok(p)) => p,
                Err(Err(why)) => {
                    return Err(self
                        .parked
                        .not_parked(why, || format!("GetKeyValue of key {key:?}")))
                }
            };
            match parked.wait().await {
                Wake::Changed(v) => return Ok((key, v)),
                Wake::Recheck => continue,
                Wake::LeaderLost => return Err(CoordError::LeaderChanged),
            }
        }
    }

    /// Every entry strictly under the directory, sorted by key; linearizable.
    pub async fn get_dir(
        &self,
        raw_dir: &str,
    ) -> Result<(String, Vec<(String, Bytes)>), CoordError> {
        let dir = self.check_key(raw_dir, "directory key")?;
        self.read_index.linearize().await?;
        let entries = self.reader.read(|a| {
            a.state
                .kv
                .list_dir(&dir)
                .map(|(k, e)| (k.clone(), e.value.clone()))
                .collect()
        });
        Ok((dir, entries))
    }
}

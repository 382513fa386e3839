//! The raw key space on the leader (`coord.kv.RawKeys`; torch's store through coord-proxy): its
//! limits, its writes through the proposer, its linearizable reads, and its waits.
//!
//! Waits (a multi-key wait, a counted barrier, a blocking pop) park in leader memory on one key at
//! a time, the first that keeps them waiting; apply wakes the calls parked on every raw key it
//! changes, and each looks at the state again. So a wait ends on the first applied state in which
//! its condition holds, as torch's own server ends it on the write that made it hold. When the
//! leader steps down every parked call fails `UNAVAILABLE` and its caller sends it again to the
//! next leader (coord-proxy does), with the same request id: a barrier's arrival or a pop already
//! applied is answered from the session table, never applied twice.

use std::sync::Arc;

use bytes::Bytes;
use coord_raft_store::raw::{shown, RawOp, RawOutput};
use coord_raft_store::{Command, Op, Output, RequestId};

use crate::error::CoordError;
use crate::serve::apply_hub::RawWaiters;
use crate::serve::kv::KvCore;
use crate::serve::namespace;
use crate::serve::parked::{Slot, Wake};

/// Longest raw key, torch's (`MAX_STRING_LEN` of its libuv server).
pub const MAX_RAW_KEY_BYTES: usize = 8 << 10;
/// Most keys one call may name, torch's (`MAX_KEY_COUNT`).
pub const MAX_RAW_KEYS_PER_CALL: usize = 128 << 10;

pub struct RawCore {
    /// The key-value core: proposer, read index, state and limits are shared with path keys.
    pub kv: Arc<KvCore>,
    pub parked: Arc<RawWaiters>,
}

/// What a parked call waits for.
enum Until<'a> {
    /// Every key has a value or a non-empty queue.
    Ready(&'a [Bytes]),
    /// The counter at the key reached this value.
    Counter(&'a Bytes, i64),
    /// The queue at the key is not empty.
    Queued(&'a Bytes),
}

impl RawCore {
    fn check_keys(&self, keys: &[Bytes]) -> Result<(), CoordError> {
        if keys.len() > MAX_RAW_KEYS_PER_CALL {
            return Err(CoordError::InvalidArgument(format!(
                "{} keys in one call; the limit is {MAX_RAW_KEYS_PER_CALL}",
                keys.len()
            )));
        }
        for k in keys {
            if k.len() > MAX_RAW_KEY_BYTES {
                return Err(CoordError::InvalidArgument(format!(
                    "raw key {:?} is {} bytes; the limit is {MAX_RAW_KEY_BYTES}",
                    shown(k),
                    k.len()
                )));
            }
        }
        Ok(())
    }

    fn check_value(&self, key: &Bytes, len: usize) -> Result<(), CoordError> {
        let max = self.kv.limits.max_value_bytes;
        if len > max {
            return Err(CoordError::InvalidArgument(format!(
                "value of raw key {:?} would be {len} bytes; the limit is {max} (--max-value-bytes)",
                shown(key)
            )));
        }
        Ok(())
    }

    /// Refuses new keys past `--max-keys` (path and raw keys count together) and, while the quota
    /// alarm is up, a write the quota would refuse; both against the applied state, before
    /// proposing.
    fn admit(&self, op: &RawOp, new_keys: &[&Bytes]) -> Result<(), CoordError> {
        let max = self.kv.limits.max_keys;
        let ns = namespace::current();
        self.kv.reader.read(|a| {
            let store = &a.state.kv;
            let count = (store.len() + store.raw().len()) as u64;
            let new = new_keys
                .iter()
                .filter(|k| store.raw().get(k).is_none())
                .count() as u64;
            if max != 0 && new > 0 && count + new > max {
                return Err(CoordError::ResourceExhausted(format!(
                    "the store holds {count} keys, its limit (--max-keys {max}); {op} refused"
                )));
            }
            a.applied
                .state
                .refusal_while_alarmed(ns.as_deref(), &Op::Raw(op.clone()))
                .map_or(Ok(()), |e| Err(e.into()))
        })
    }

    async fn commit(&self, id: Option<RequestId>, op: RawOp) -> Result<RawOutput, CoordError> {
        let result = self
            .kv
            .proposer
            .propose(Command {
                request: id,
                op: Op::Raw(op),
            })
            .await?;
        match result? {
            Output::Raw(out) => Ok(out),
            other => Err(CoordError::Internal(format!("a raw op answered {other:?}"))),
        }
    }

    /// Sets every pair, in order, as one write.
    pub async fn set(
        &self,
        id: Option<RequestId>,
        entries: Vec<(Bytes, Bytes)>,
    ) -> Result<(), CoordError> {
        let keys: Vec<Bytes> = entries.iter().map(|(k, _)| k.clone()).collect();
        self.check_keys(&keys)?;
        for (k, v) in &entries {
            self.check_value(k, v.len())?;
        }
        let op = RawOp::Set { entries };
        self.admit(&op, &keys.iter().collect::<Vec<_>>())?;
        self.commit(id, op).await.map(|_| ())
    }

    pub async fn compare_set(
        &self,
        id: Option<RequestId>,
        key: Bytes,
        expected: Bytes,
        desired: Bytes,
    ) -> Result<Option<Bytes>, CoordError> {
        self.check_keys(std::slice::from_ref(&key))?;
        self.check_value(&key, desired.len())?;
        let op = RawOp::CompareSet {
            key: key.clone(),
            expected,
            desired,
        };
        self.admit(&op, &[&key])?;
        match self.commit(id, op).await? {
            RawOutput::Value(v) => Ok(v),
            other => Err(unexpected("compare_set", &other)),
        }
    }

    pub async fn add(
        &self,
        id: Option<RequestId>,
        key: Bytes,
        delta: i64,
    ) -> Result<i64, CoordError> {
        self.check_keys(std::slice::from_ref(&key))?;
        let op = RawOp::Add {
            key: key.clone(),
            delta,
        };
        self.admit(&op, &[&key])?;
        match self.commit(id, op).await? {
            RawOutput::Count(n) => Ok(n),
            other => Err(unexpected("add", &other)),
        }
    }

    pub async fn append(
        &self,
        id: Option<RequestId>,
        key: Bytes,
        value: Bytes,
    ) -> Result<(), CoordError> {
        self.check_keys(std::slice::from_ref(&key))?;
        let now = self
            .kv
            .reader
            .read(|a| a.state.kv.raw().get(&key).map_or(0, Bytes::len));
        self.check_value(&key, now + value.len())?;
        let op = RawOp::Append {
            key: key.clone(),
            value,
        };
        self.admit(&op, &[&key])?;
        self.commit(id, op).await.map(|_| ())
    }

    /// Deletes the key's value; how many keys went (0 or 1).
    pub async fn delete(&self, id: Option<RequestId>, key: Bytes) -> Result<i64, CoordError> {
        self.check_keys(std::slice::from_ref(&key))?;
        match self.commit(id, RawOp::Delete { key }).await? {
            RawOutput::Count(n) => Ok(n),
            other => Err(unexpected("delete", &other)),
        }
    }

    pub async fn queue_push(
        &self,
        id: Option<RequestId>,
        key: Bytes,
        value: Bytes,
    ) -> Result<(), CoordError> {
        self.check_keys(std::slice::from_ref(&key))?;
        self.check_value(&key, value.len())?;
        let op = RawOp::QueuePush { key, value };
        self.admit(&op, &[])?;
        self.commit(id, op).await.map(|_| ())
    }

    /// Takes the oldest value of the queue (with `block`, waiting for one), and tells the
    /// queue's length before.
    pub async fn queue_pop(
        &self,
        id: Option<RequestId>,
        key: Bytes,
        block: bool,
    ) -> Result<(Option<Bytes>, u64), CoordError> {
        self.check_keys(std::slice::from_ref(&key))?;
        let mut slot = None;
        loop {
            if block {
                self.wait_until(Until::Queued(&key), &mut slot).await?;
            }
            let op = RawOp::QueuePop {
                key: key.clone(),
                block,
            };
            match self.commit(id, op).await {
                Ok(RawOutput::Popped { value, length }) => return Ok((value, length)),
                Ok(other) => return Err(unexpected("queue_pop", &other)),
                // Another caller took the value first: wait for the next one.
                Err(CoordError::Op(coord_raft_store::OpError::QueueEmpty { .. })) if block => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Adds 1 to the counter at `key` and waits until it reaches `world_size`; the counter
    /// after this arrival.
    pub async fn barrier(
        &self,
        id: Option<RequestId>,
        key: Bytes,
        world_size: i64,
    ) -> Result<i64, CoordError> {
        let count = self.add(id, key.clone(), 1).await?;
        if count < world_size {
            self.wait_until(Until::Counter(&key, world_size), &mut None)
                .await?;
        }
        Ok(count)
    }

    /// Waits until every key has a value or a non-empty queue.
    pub async fn wait(&self, keys: &[Bytes]) -> Result<(), CoordError> {
        self.check_keys(keys)?;
        self.wait_until(Until::Ready(keys), &mut None).await
    }

    /// The values of `keys` (`None`: missing); linearizable.
    pub async fn get(&self, keys: &[Bytes]) -> Result<Vec<Option<Bytes>>, CoordError> {
        self.check_keys(keys)?;
        self.kv.read_index.linearize().await?;
        Ok(self.kv.reader.read(|a| {
            let raw = a.state.kv.raw();
            keys.iter().map(|k| raw.get(k).cloned()).collect()
        }))
    }

    /// Whether every key has a value or a non-empty queue; linearizable.
    pub async fn check(&self, keys: &[Bytes]) -> Result<bool, CoordError> {
        self.check_keys(keys)?;
        self.kv.read_index.linearize().await?;
        Ok(self
            .kv
            .reader
            .read(|a| keys.iter().all(|k| a.state.kv.raw().ready(k))))
    }

    pub async fn queue_len(&self, key: &Bytes) -> Result<i64, CoordError> {
        self.check_keys(std::slice::from_ref(key))?;
        self.kv.read_index.linearize().await?;
        Ok(self
            .kv
            .reader
            .read(|a| a.state.kv.raw().queue_len(key) as i64))
    }

    /// How many keys start with `prefix`, and which (when `with_keys`), in byte order.
    pub async fn list(
        &self,
        prefix: &Bytes,
        with_keys: bool,
    ) -> Result<(i64, Vec<Bytes>), CoordError> {
        self.kv.read_index.linearize().await?;
        Ok(self.kv.reader.read(|a| {
            let raw = a.state.kv.raw();
            if with_keys {
                let keys: Vec<Bytes> = raw.keys_with_prefix(prefix).cloned().collect();
                (keys.len() as i64, keys)
            } else if prefix.is_empty() {
                (raw.len() as i64, Vec::new())
            } else {
                (raw.keys_with_prefix(prefix).count() as i64, Vec::new())
            }
        }))
    }

    /// Parks until `until` holds, looking again at every change of the key it waits on.
    async fn wait_until(
        &self,
        until: Until<'_>,
        slot: &mut Option<Slot>,
    ) -> Result<(), CoordError> {
        // Taken before leadership is confirmed: if it is lost any time after, parking fails.
        let epoch = self.parked.epoch();
        self.kv.read_index.linearize().await?;
        loop {
            let parked = self.kv.reader.read(|a| {
                let raw = a.state.kv.raw();
                let waiting_on = match &until {
                    Until::Ready(keys) => keys.iter().find(|k| !raw.ready(k)),
                    Until::Counter(k, at_least) => {
                        (raw.counter(k).unwrap_or(0) < *at_least).then_some(*k)
                    }
                    Until::Queued(k) => (raw.queue_len(k) == 0).then_some(*k),
                };
                waiting_on.map(|k| self.parked.park(k, epoch, slot))
            });
            let mut parked = match parked {
                None => return Ok(()),
                Some(Ok(p)) => p,
                Some(Err(why)) => {
                    return Err(self
                        .parked
                        .not_parked(why, || "a wait on raw keys".to_string()))
                }
            };
            match parked.wait().await {
                Wake::Changed(()) | Wake::Recheck => continue,
                Wake::LeaderLost => return Err(CoordError::LeaderChanged),
            }
        }
    }
}

fn unexpected(what: &str, out: &RawOutput) -> CoordError {
    CoordError::Internal(format!("raw {what} answered {out:?}"))
}

//! What each torch request does on the ensemble: calls of `coord.kv.RawKeys`, sent through the
//! proxy's [`CoordClient`] (leader following, failover), under the connection's own session of
//! request ids so that a call re-sent to a new leader applies once.
//!
//! Keys get the proxy's `--tcpstore-prefix` in front (so two jobs on one ensemble each see a store
//! of their own), and lose it again in LIST_KEYS. torch's one quirk the ensemble does not make
//! itself: COMPARE_SET of a missing key with a non-empty expected value answers the expected
//! value (the ensemble answers "missing").

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use coord_proto::coord::kv as pb;
use coord_proto::metadata::RequestSession;
use tonic::Status;

use super::adds::Adds;
use super::reads::{raw, Reads};
use super::waits::Waits;
use crate::client::CoordClient;

/// A MULTI_SET larger than this goes to the ensemble in several writes, each under the
/// ensemble's default request size limit (`--max-value-bytes`, 4 MiB, and the key).
const SET_BATCH_BYTES: usize = 3 << 20;

/// One torch connection's view of the ensemble.
pub struct Store {
    client: CoordClient,
    /// This connection's request ids: one client of the ensemble per torch connection.
    session: Arc<RequestSession>,
    prefix: Bytes,
    /// GETs and ADDs go out in flights shared with the proxy's other connections, and WAITs for
    /// the same keys park one call.
    reads: Reads,
    adds: Adds,
    waits: Waits,
}

/// Calls one `RawKeys` method: `$m` the method, `$req` the request, `$write` whether it takes a
/// request id, `$waits` whether it may park on the leader.
///
/// The call's future (a tonic call and the client's failover, 4-5 KB) is boxed: a connection's
/// task keeps room for the largest request it may make for as long as it lives, and a torch
/// connection lives as long as its job, mostly idle or parked in a WAIT, which needs none of it.
macro_rules! call {
    ($self:ident, $m:ident, $req:expr, $write:expr, $waits:expr) => {
        Box::pin($self.client.forward_in(
            $write.then_some(&$self.session),
            $req,
            $waits,
            |ch, r| async move { raw(ch).$m(r).await },
        ))
        .await
    };
}

impl Store {
    /// The first connection's store (call inside a tokio runtime: it starts the GET flights).
    pub fn new(client: CoordClient, prefix: Bytes) -> Self {
        Self {
            reads: Reads::start(client.clone()),
            adds: Adds::start(client.clone()),
            waits: Waits::new(client.clone()),
            client,
            session: CoordClient::new_session(),
            prefix,
        }
    }

    /// Another connection's store: a session of its own, the GET flights shared.
    pub fn sibling(&self) -> Self {
        Self {
            client: self.client.clone(),
            session: CoordClient::new_session(),
            prefix: self.prefix.clone(),
            reads: self.reads.clone(),
            adds: self.adds.clone(),
            waits: self.waits.clone(),
        }
    }

    fn key(&self, key: &[u8]) -> Bytes {
        if self.prefix.is_empty() {
            return Bytes::copy_from_slice(key);
        }
        let mut k = BytesMut::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(&self.prefix);
        k.extend_from_slice(key);
        k.freeze()
    }

    fn keys(&self, keys: &[Bytes]) -> Vec<Bytes> {
        keys.iter().map(|k| self.key(k)).collect()
    }

    /// Sets every pair (SET is one), in as few writes as the ensemble's request limit allows.
    pub async fn set(&self, pairs: Vec<(Bytes, Bytes)>) -> Result<(), Status> {
        let mut batch = Vec::new();
        let mut size = 0;
        let mut pairs = pairs.into_iter().peekable();
        while let Some((k, v)) = pairs.next() {
            size += k.len() + v.len();
            batch.push(pb::RawEntry {
                key: self.key(&k),
                value: v,
            });
            let next = pairs.peek().map_or(0, |(k, v)| k.len() + v.len());
            if pairs.peek().is_none() || size + next > SET_BATCH_BYTES {
                let req = pb::RawSetRequest {
                    entries: std::mem::take(&mut batch),
                };
                call!(self, set, req, true, false)?;
                size = 0;
            }
        }
        Ok(())
    }

    /// The values of `keys`, a missing key's empty (torch's server answers so; its client waits
    /// for the keys first).
    pub async fn get(&self, keys: &[Bytes]) -> Result<Vec<Bytes>, Status> {
        self.reads.get(self.keys(keys)).await
    }

    /// torch's COMPARE_SET answer: the value after the call, or `expected` for a missing key.
    pub async fn compare_set(
        &self,
        key: &[u8],
        expected: Bytes,
        desired: Bytes,
    ) -> Result<Bytes, Status> {
        let req = pb::RawCompareSetRequest {
            key: self.key(key),
            expected: expected.clone(),
            desired,
        };
        let resp = call!(self, compare_set, req, true, false)?;
        Ok(match resp.current {
            Some(v) if v.found => v.value,
            _ => expected,
        })
    }

    /// Adds `delta` to the counter at `key` (with the ADDs of the proxy's other connections).
    pub async fn add(&self, key: &[u8], delta: i64) -> Result<i64, Status> {
        self.adds.add(self.key(key), delta).await
    }

    pub async fn append(&self, key: &[u8], value: Bytes) -> Result<(), Status> {
        let req = pb::RawAppendRequest {
            key: self.key(key),
            value,
        };
        call!(self, append, req, true, false).map(|_| ())
    }

    pub async fn delete(&self, key: &[u8]) -> Result<i64, Status> {
        let req = pb::RawDeleteRequest { key: self.key(key) };
        Ok(call!(self, delete, req, true, false)?.deleted)
    }

    pub async fn check(&self, keys: &[Bytes]) -> Result<bool, Status> {
        let req = pb::RawKeysRequest {
            keys: self.keys(keys),
        };
        Ok(call!(self, check, req, false, false)?.ready)
    }

    /// Parks until every key exists (with every other connection's WAIT for the same keys);
    /// dropping the future gives up its place, and the last to go cancels the wait on the leader.
    pub async fn wait(&self, keys: &[Bytes]) -> Result<(), Status> {
        self.waits.wait(self.keys(keys)).await
    }

    /// One arrival at the counted barrier `key`, parked until the counter reaches `world_size`.
    pub async fn barrier(&self, key: &[u8], world_size: i64) -> Result<i64, Status> {
        let req = pb::RawBarrierRequest {
            key: self.key(key),
            world_size,
        };
        Ok(call!(self, barrier, req, true, true)?.count)
    }

    pub async fn queue_push(&self, key: &[u8], value: Bytes) -> Result<(), Status> {
        let req = pb::RawQueuePushRequest {
            key: self.key(key),
            value,
        };
        call!(self, queue_push, req, true, false).map(|_| ())
    }

    /// The queue's length before the pop, and the value taken (torch's client waits for the key
    /// itself before a blocking pop, so this one never blocks).
    pub async fn queue_pop(&self, key: &[u8]) -> Result<(i64, Option<Bytes>), Status> {
        let req = pb::RawQueuePopRequest {
            key: self.key(key),
            block: false,
        };
        let resp = call!(self, queue_pop, req, true, false)?;
        let value = resp.value.filter(|v| v.found).map(|v| v.value);
        Ok((resp.length, value))
    }

    pub async fn queue_len(&self, key: &[u8]) -> Result<i64, Status> {
        let req = pb::RawQueueLenRequest { key: self.key(key) };
        Ok(call!(self, queue_len, req, false, false)?.length)
    }

    /// This store's keys (`with_keys`) or only their number.
    pub async fn list(&self, with_keys: bool) -> Result<(i64, Vec<Bytes>), Status> {
        let req = pb::RawListRequest {
            prefix: self.prefix.clone(),
            with_keys,
        };
        let resp = call!(self, list, req, false, false)?;
        let n = self.prefix.len();
        let keys = resp
            .keys
            .into_iter()
            .map(|k| k.slice(n.min(k.len())..))
            .collect();
        Ok((resp.count, keys))
    }
}

//! The key-value store through [`CoordClient`]: TensorFlow's key-value calls (insert, blocking and
//! non-blocking get, directory get, delete) and coord's own (increment, watch).
//!
//! Inserts and deletes carry a request id, so a retry through a failover applies once; a blocking
//! get may wait on the service as long as it takes, so it has no attempt timeout.

use bytes::Bytes;
use coord_proto::coord::kv::key_value_client::KeyValueClient;
use coord_proto::coord::kv::raw_keys_client::RawKeysClient;
use coord_proto::coord::kv::{
    IncrementRequest, RawAddAnswer, RawAddRequest, RawAddsRequest, WatchRequest, WatchResponse,
};
use coord_proto::tensorflow as tf;
use tonic::{Code, Status};

use coord_proto::metadata::Ticket;

use super::{tf_client, CoordClient};

/// What an attempt of [`CoordClient::raw_adds`] may take per add beyond the attempt timeout: a
/// call of 8,192 adds, 4 s more (each is a command the leader proposes and applies).
const ATTEMPT_PER_ADD: std::time::Duration = std::time::Duration::from_micros(500);

impl CoordClient {
    /// Inserts `key`; with `overwrite` false an existing key is ALREADY_EXISTS.
    pub async fn insert(
        &self,
        key: &str,
        value: impl Into<Bytes>,
        overwrite: bool,
    ) -> Result<(), Status> {
        let req = tf::InsertKeyValueRequest {
            kv: Some(tf::KeyValueEntry {
                key: key.to_string(),
                value: value.into(),
            }),
            allow_overwrite: overwrite,
        };
        let ticket = self.inner.session.begin();
        self.call(req, Some(&ticket), |ch, r| async move {
            tf_client(ch).insert_key_value(r).await
        })
        .await
        .map(|_| ())
    }

    /// The value of `key`, waiting until some task inserts it.
    pub async fn get(&self, key: &str) -> Result<Bytes, Status> {
        let req = tf::GetKeyValueRequest {
            key: key.to_string(),
        };
        let resp = self
            .call_parked(req, None, |ch, r| async move {
                tf_client(ch).get_key_value(r).await
            })
            .await?;
        Ok(resp.kv.map(|e| e.value).unwrap_or_default())
    }

    /// The value of `key`, or `None` if it does not exist.
    pub async fn try_get(&self, key: &str) -> Result<Option<Bytes>, Status> {
        let req = tf::TryGetKeyValueRequest {
            key: key.to_string(),
        };
        match self
            .call(req, None, |ch, r| async move {
                tf_client(ch).try_get_key_value(r).await
            })
            .await
        {
            Ok(resp) => Ok(Some(resp.kv.map(|e| e.value).unwrap_or_default())),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(s),
        }
    }

    /// Every entry under directory `dir`, sorted by key.
    pub async fn get_dir(&self, dir: &str) -> Result<Vec<(String, Bytes)>, Status> {
        let req = tf::GetKeyValueDirRequest {
            directory_key: dir.to_string(),
        };
        let resp = self
            .call(req, None, |ch, r| async move {
                tf_client(ch).get_key_value_dir(r).await
            })
            .await?;
        Ok(resp.kv.into_iter().map(|e| (e.key, e.value)).collect())
    }

    /// Deletes `key` and everything under `key/`.
    pub async fn delete(&self, key: &str) -> Result<(), Status> {
        let req = tf::DeleteKeyValueRequest {
            key: key.to_string(),
            is_directory: true,
        };
        let ticket = self.inner.session.begin();
        self.call(req, Some(&ticket), |ch, r| async move {
            tf_client(ch).delete_key_value(r).await
        })
        .await
        .map(|_| ())
    }

    /// Adds `delta` to the decimal integer at `key` (0 if missing); returns the new value.
    pub async fn increment(&self, key: &str, delta: i64) -> Result<i64, Status> {
        let req = IncrementRequest {
            key: key.to_string(),
            delta,
        };
        let resp = self
            .mutate(req, |ch, r| async move {
                KeyValueClient::new(ch).increment(r).await
            })
            .await?;
        std::str::from_utf8(&resp.value)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                Status::internal(format!(
                    "increment of {key:?} returned a non-number {:?}",
                    resp.value
                ))
            })
    }

    /// Opens a watch of `key` (and everything under `key/`) on the leader, from `start_revision`
    /// (0 = from now).
    pub async fn open_watch(
        &self,
        key: &str,
        start_revision: u64,
    ) -> Result<tonic::Streaming<WatchResponse>, Status> {
        let req = WatchRequest {
            key: key.to_string(),
            start_revision,
        };
        self.call(req, None, |ch, r| async move {
            KeyValueClient::new(ch).watch(r).await
        })
        .await
    }

    /// Several raw-key adds in one call (`RawKeys.Adds`), each under a request number of its own,
    /// so that the call sent again after a leader change applies each once; one answer per add,
    /// in order. An attempt may take a little longer per add than a call of one.
    ///
    /// A call that fails as a whole hands its adds back with their numbers ([`AddsFailed`]): the
    /// ensemble may have applied them before the call broke (a connection the server ended with
    /// `RESOURCE_EXHAUSTED` fails without a retry), and only an add sent again under the number
    /// it had is answered as it was instead of applied again.
    pub async fn raw_adds(
        &self,
        adds: Vec<RawAddRequest>,
    ) -> Result<Vec<RawAddAnswer>, AddsFailed> {
        let (tickets, call) = self.tickets(adds.len());
        let limit = self.inner.options.attempt_timeout + ATTEMPT_PER_ADD * adds.len() as u32;
        let req = RawAddsRequest {
            add_seqs: tickets.iter().map(|t| t.id.seq).collect(),
            adds,
        };
        let resp = self
            .call_with(req.clone(), Some(&call), Some(limit), |ch, r| async move {
                RawKeysClient::new(ch).adds(r).await
            })
            .await;
        match resp {
            Ok(r) => Ok(r.answers),
            Err(status) => Err(AddsFailed {
                status,
                numbered: req.adds.into_iter().zip(tickets).collect(),
            }),
        }
    }

    /// One raw-key add on a call of its own, under `ticket`'s number.
    async fn raw_add_numbered(&self, req: RawAddRequest, ticket: &Ticket) -> Result<i64, Status> {
        let resp = self
            .call(req, Some(ticket), |ch, r| async move {
                RawKeysClient::new(ch).add(r).await
            })
            .await?;
        Ok(resp.value)
    }
}

/// The adds of a [`CoordClient::raw_adds`] call that failed as a whole, each with the request
/// number it was sent under (held until they are sent again or given up).
pub struct AddsFailed {
    /// Why the call failed.
    pub status: Status,
    numbered: Vec<(RawAddRequest, Ticket)>,
}

impl AddsFailed {
    /// How many adds the call carried.
    pub fn len(&self) -> usize {
        self.numbered.len()
    }

    pub fn is_empty(&self) -> bool {
        self.numbered.is_empty()
    }

    /// Every add on a call of its own, all at once, each under the number it had in the failed
    /// call: one the ensemble applied then is answered with the value it had, not applied again.
    /// The answers in the order of the adds.
    pub async fn each_alone(self, client: &CoordClient) -> Vec<Result<i64, Status>> {
        let calls = self
            .numbered
            .into_iter()
            .map(|(req, ticket)| async move { client.raw_add_numbered(req, &ticket).await });
        futures::future::join_all(calls).await
    }
}

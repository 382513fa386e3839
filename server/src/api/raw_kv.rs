//! `coord.kv.RawKeys`: the raw key space's wire adapter (the semantics are in
//! [`RawCore`](crate::serve::raw_kv::RawCore)). Every method is routed to the leader; mutations
//! carry request ids, waits park there.

use std::sync::Arc;

use bytes::Bytes;
use coord_proto::coord::kv as pb;
use coord_proto::coord::kv::raw_keys_client::RawKeysClient;
use coord_proto::coord::kv::raw_keys_server::RawKeys;
use tonic::{Request, Response, Status};

use crate::api::numbered::{item_answer, item_id, numbered};
use crate::error::CoordError;
use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::raw_kv::RawCore;
use crate::serve::route::{Kind, Router};

pub struct RawKeyService {
    router: Arc<Router>,
    core: Arc<RawCore>,
}

impl RawKeyService {
    pub fn new(router: Arc<Router>, core: Arc<RawCore>) -> Self {
        Self { router, core }
    }
}

fn value(v: Option<Bytes>) -> pb::RawValue {
    pb::RawValue {
        found: v.is_some(),
        value: v.unwrap_or_default(),
    }
}

/// The leader's client for a forwarded call: a value may be as large as a request may (torch's
/// values reach 8 MiB, past gRPC's default 4 MiB).
fn client(ch: PeerChannel) -> RawKeysClient<PeerChannel> {
    RawKeysClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

/// Most adds in one `Adds` call: a burst of thousands of torch ranks goes in a few calls, and no
/// call holds the leader's proposer for long.
pub const MAX_ADDS: usize = 8_192;

/// Checks an `Adds` call before it is routed: no more than [`MAX_ADDS`] adds, numbered as such
/// calls must be (see [`numbered`]).
fn adds_well_formed(req: &Request<pb::RawAddsRequest>) -> Result<(), Status> {
    let m = req.get_ref();
    if m.adds.len() > MAX_ADDS {
        return Err(Status::invalid_argument(format!(
            "adds: {} adds in one call; send at most {MAX_ADDS}",
            m.adds.len()
        )));
    }
    numbered(req, "add_seqs", m.add_seqs.len(), "adds", m.adds.len())
}

/// One add's answer as its own Add call would have had it; `Err` for an error the whole call must
/// end with, one that routing re-drives (the leader changed meanwhile).
fn add_answer(added: Result<i64, CoordError>) -> Result<pb::RawAddAnswer, CoordError> {
    item_answer(
        added,
        |value| pb::RawAddAnswer {
            value,
            ..Default::default()
        },
        |error_code, error_message, _| pb::RawAddAnswer {
            value: 0,
            error_code,
            error_message,
        },
    )
}

#[tonic::async_trait]
impl RawKeys for RawKeyService {
    async fn set(
        &self,
        req: Request<pb::RawSetRequest>,
    ) -> Result<Response<pb::RawSetResponse>, Status> {
        routed!(self, req, "raw/Set", Kind::Write, set, |raw, m, id| {
            let entries = m.entries.into_iter().map(|e| (e.key, e.value)).collect();
            raw.set(id, entries).await?;
            Ok(pb::RawSetResponse {})
        })
    }

    async fn get(
        &self,
        req: Request<pb::RawGetRequest>,
    ) -> Result<Response<pb::RawGetResponse>, Status> {
        routed!(self, req, "raw/Get", Kind::Read, get, |raw, m, _| {
            let values = raw.get(&m.keys).await?;
            Ok(pb::RawGetResponse {
                values: values.into_iter().map(value).collect(),
            })
        })
    }

    async fn compare_set(
        &self,
        req: Request<pb::RawCompareSetRequest>,
    ) -> Result<Response<pb::RawCompareSetResponse>, Status> {
        routed!(
            self,
            req,
            "raw/CompareSet",
            Kind::Write,
            compare_set,
            |raw, m, id| {
                let current = raw.compare_set(id, m.key, m.expected, m.desired).await?;
                Ok(pb::RawCompareSetResponse {
                    current: Some(value(current)),
                })
            }
        )
    }

    async fn add(
        &self,
        req: Request<pb::RawAddRequest>,
    ) -> Result<Response<pb::RawAddResponse>, Status> {
        routed!(self, req, "raw/Add", Kind::Write, add, |raw, m, id| {
            let value = raw.add(id, m.key, m.delta).await?;
            Ok(pb::RawAddResponse { value })
        })
    }

    async fn adds(
        &self,
        req: Request<pb::RawAddsRequest>,
    ) -> Result<Response<pb::RawAddsResponse>, Status> {
        adds_well_formed(&req)?;
        routed!(self, req, "raw/Adds", Kind::Write, adds, |raw, m, id| {
            let seqs = m.add_seqs;
            let each = m.adds.into_iter().enumerate().map(|(i, a)| {
                let own = item_id(id, &seqs, i);
                async move { add_answer(raw.add(own, a.key, a.delta).await) }
            });
            let answers = futures::future::join_all(each)
                .await
                .into_iter()
                .collect::<Result<_, _>>()?;
            Ok(pb::RawAddsResponse { answers })
        })
    }

    async fn append(
        &self,
        req: Request<pb::RawAppendRequest>,
    ) -> Result<Response<pb::RawAppendResponse>, Status> {
        routed!(
            self,
            req,
            "raw/Append",
            Kind::Write,
            append,
            |raw, m, id| {
                raw.append(id, m.key, m.value).await?;
                Ok(pb::RawAppendResponse {})
            }
        )
    }

    async fn delete(
        &self,
        req: Request<pb::RawDeleteRequest>,
    ) -> Result<Response<pb::RawDeleteResponse>, Status> {
        routed!(
            self,
            req,
            "raw/Delete",
            Kind::Write,
            delete,
            |raw, m, id| {
                let deleted = raw.delete(id, m.key).await?;
                Ok(pb::RawDeleteResponse { deleted })
            }
        )
    }

    async fn queue_push(
        &self,
        req: Request<pb::RawQueuePushRequest>,
    ) -> Result<Response<pb::RawQueuePushResponse>, Status> {
        routed!(
            self,
            req,
            "raw/QueuePush",
            Kind::Write,
            queue_push,
            |raw, m, id| {
                raw.queue_push(id, m.key, m.value).await?;
                Ok(pb::RawQueuePushResponse {})
            }
        )
    }

    async fn queue_pop(
        &self,
        req: Request<pb::RawQueuePopRequest>,
    ) -> Result<Response<pb::RawQueuePopResponse>, Status> {
        routed!(
            self,
            req,
            "raw/QueuePop",
            Kind::Write,
            queue_pop,
            |raw, m, id| {
                let (popped, length) = raw.queue_pop(id, m.key, m.block).await?;
                Ok(pb::RawQueuePopResponse {
                    value: Some(value(popped)),
                    length: length as i64,
                })
            }
        )
    }

    async fn queue_len(
        &self,
        req: Request<pb::RawQueueLenRequest>,
    ) -> Result<Response<pb::RawQueueLenResponse>, Status> {
        routed!(
            self,
            req,
            "raw/QueueLen",
            Kind::Read,
            queue_len,
            |raw, m, _| {
                let length = raw.queue_len(&m.key).await?;
                Ok(pb::RawQueueLenResponse { length })
            }
        )
    }

    async fn check(
        &self,
        req: Request<pb::RawKeysRequest>,
    ) -> Result<Response<pb::RawCheckResponse>, Status> {
        routed!(self, req, "raw/Check", Kind::Read, check, |raw, m, _| {
            let ready = raw.check(&m.keys).await?;
            Ok(pb::RawCheckResponse { ready })
        })
    }

    async fn wait(
        &self,
        req: Request<pb::RawKeysRequest>,
    ) -> Result<Response<pb::RawWaitResponse>, Status> {
        routed!(self, req, "raw/Wait", Kind::Read, wait, |raw, m, _| {
            raw.wait(&m.keys).await?;
            Ok(pb::RawWaitResponse {})
        })
    }

    async fn barrier(
        &self,
        req: Request<pb::RawBarrierRequest>,
    ) -> Result<Response<pb::RawBarrierResponse>, Status> {
        routed!(
            self,
            req,
            "raw/Barrier",
            Kind::Write,
            barrier,
            |raw, m, id| {
                let count = raw.barrier(id, m.key, m.world_size).await?;
                Ok(pb::RawBarrierResponse { count })
            }
        )
    }

    async fn list(
        &self,
        req: Request<pb::RawListRequest>,
    ) -> Result<Response<pb::RawListResponse>, Status> {
        routed!(self, req, "raw/List", Kind::Read, list, |raw, m, _| {
            let (count, keys) = raw.list(&m.prefix, m.with_keys).await?;
            Ok(pb::RawListResponse { count, keys })
        })
    }
}

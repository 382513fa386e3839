//! Routing: every client RPC runs on the leader, whichever replica it reached.
//!
//! On the leader the request is served locally; on a follower it is forwarded to the leader over a
//! cached channel, marked so that the leader never forwards it again. When the attempt fails with
//! a retryable error (no leader, the leader changed, the leader became unreachable, a parked call
//! lost its leader) the replica that received the request waits for the next leader and drives the
//! same request again, with the same request id, so a mutation still applies once and a parked
//! call completes with the answer it would have had. Only when no leader can be reached for
//! `leader_wait` does the caller see `UNAVAILABLE`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::RequestId;
use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

use crate::error::{add_leader_hint, CoordError};
use crate::leader::{LeaderWatch, Leadership};
use crate::metrics::Metrics;
use crate::peers::PeerChannels;
use coord_proto::metadata::RequestSession;

use crate::request_id::{self, FORWARDED_HEADER};

/// Whether a request changes state (and therefore needs a request id).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
}

pub struct Router {
    me: u64,
    leader: LeaderWatch,
    channels: PeerChannels,
    session: Arc<RequestSession>,
    leader_wait: Duration,
    metrics: Arc<Metrics>,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(100);

impl Router {
    pub fn new(me: u64, leader: LeaderWatch, leader_wait: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            me,
            leader,
            channels: PeerChannels::default(),
            session: request_id::local_session(),
            leader_wait,
            metrics,
        }
    }

    pub fn leadership(&self) -> Leadership {
        self.leader.current()
    }

    /// Runs `req` on the leader: `local` when this replica leads, `remote` (a call of the same
    /// method on the leader's channel) otherwise. Records the RPC in the metrics.
    pub async fn route<Req, Resp, L, LF, R, RF>(
        &self,
        method: &'static str,
        kind: Kind,
        req: Request<Req>,
        local: L,
        remote: R,
    ) -> Result<Response<Resp>, Status>
    where
        Req: Clone,
        L: Fn(Req, Option<RequestId>) -> LF,
        LF: Future<Output = Result<Resp, CoordError>>,
        R: Fn(Channel, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<Resp>, Status>>,
    {
        let started = std::time::Instant::now();
        let result = self.drive(kind, req, local, remote).await;
        let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
        self.metrics.record_rpc(method, code, started.elapsed());
        result.map(Response::new)
    }

    async fn drive<Req, Resp, L, LF, R, RF>(
        &self,
        kind: Kind,
        req: Request<Req>,
        local: L,
        remote: R,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        L: Fn(Req, Option<RequestId>) -> LF,
        LF: Future<Output = Result<Resp, CoordError>>,
        R: Fn(Channel, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<Resp>, Status>>,
    {
        let forwarded = req.metadata().contains_key(FORWARDED_HEADER);
        let given_id = match kind {
            Kind::Write => request_id::from_metadata(req.metadata())?,
            Kind::Read => None,
        };
        // A write that arrived without an id gets one of ours; the ticket lives as long as we
        // drive the request.
        let ticket = (kind == Kind::Write && given_id.is_none()).then(|| self.session.begin());
        let id = given_id.or(ticket.as_ref().map(|t| request_id::to_request_id(&t.id)));
        let msg = req.into_inner();

        let mut failing_since: Option<Instant> = None;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let seen = self.leader.current();
            let failure: Status = match &seen {
                Leadership::Me => {
                    // If leadership lapses mid-call, the outcome is left to the log and the call is
                    // driven again (same request id) wherever leadership went.
                    let outcome = tokio::select! {
                        r = local(msg.clone(), id) => r,
                        () = self.leader.lost() => Err(CoordError::LeaderChanged),
                    };
                    match outcome {
                        Ok(resp) => return Ok(resp),
                        Err(e) if e.is_retryable() && !forwarded => e.into(),
                        Err(e) => return Err(self.with_hint(e.into())),
                    }
                }
                Leadership::Other { id: leader, addr } => {
                    if forwarded {
                        // The sender believed we lead; tell it who does instead of bouncing on.
                        return Err(CoordError::NotLeader {
                            me: self.me,
                            leader: Some((*leader, addr.clone())),
                        }
                        .into());
                    }
                    match self.forward(addr, &msg, id, &remote).await {
                        Ok(resp) => return Ok(resp),
                        Err(s) if coord_proto::metadata::is_retryable(&s) => s,
                        Err(s) => return Err(s),
                    }
                }
                Leadership::Unknown => {
                    if forwarded {
                        return Err(CoordError::NotLeader {
                            me: self.me,
                            leader: None,
                        }
                        .into());
                    }
                    Status::unavailable("no leader is elected")
                }
            };
            let since = *failing_since.get_or_insert_with(Instant::now);
            let give_up_at = since + self.leader_wait;
            if Instant::now() >= give_up_at {
                return Err(Status::unavailable(format!(
                    "no leader could serve the request for {} ms (replica {} sees: {:?}); last error: {}",
                    self.leader_wait.as_millis(),
                    self.me,
                    seen,
                    failure.message()
                )));
            }
            let wake_at = (Instant::now() + backoff).min(give_up_at);
            let next = self.leader.changed_from(&seen, wake_at).await;
            if next == seen {
                backoff = (backoff * 2).min(MAX_BACKOFF);
            } else {
                backoff = FIRST_BACKOFF;
            }
        }
    }

    async fn forward<Req, Resp, R, RF>(
        &self,
        addr: &str,
        msg: &Req,
        id: Option<RequestId>,
        remote: &R,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        R: Fn(Channel, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<Resp>, Status>>,
    {
        let channel = self.channels.get(addr).map_err(Status::internal)?;
        let mut req = Request::new(msg.clone());
        if let Ok(v) = self.me.to_string().parse() {
            req.metadata_mut().insert(FORWARDED_HEADER, v);
        }
        if let Some(id) = &id {
            request_id::to_metadata(id, req.metadata_mut());
        }
        remote(channel, req).await.map(Response::into_inner)
    }

    fn with_hint(&self, mut s: Status) -> Status {
        if s.code() == Code::Unavailable {
            if let Some((id, addr)) = self.leader.current().hint() {
                add_leader_hint(&mut s, id, &addr);
            }
        }
        s
    }
}

//! Routing: every client RPC runs on the leader, whichever replica it reached.
//!
//! On the leader the request is served locally; on a follower it is forwarded to the leader over a
//! cached channel, marked so that the leader never forwards it again. When the attempt fails with
//! a retryable error (no leader, the leader changed, the leader became unreachable, a parked call
//! lost its leader), or this replica stops believing in the leader it forwarded to, the replica that received the request waits for the next leader and drives the
//! same request again, with the same request id, so a mutation still applies once and a parked
//! call completes with the answer it would have had. Only when no leader can be reached for
//! `leader_wait` (or no leader is known for [`NO_LEADER_WAIT`]) does the caller see
//! `UNAVAILABLE`, and try another replica. Except for jaxlib's and TensorFlow's clients: they take
//! `UNAVAILABLE` as fatal and cannot try another replica, so their calls (XLA and TF methods
//! without the `coord-fails-over` mark coord's own clients send) are held until a leader serves
//! them or the client gives up.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

mod calls;

use crate::raft::peers::PeerChannel;
use coord_raft_store::RequestId;
use futures::future::Either;
use tokio::time::Instant;
use tonic::{Code, Request, Response, Status};

use crate::error::{add_leader_hint, CoordError};
use crate::ops::metrics::Metrics;
use crate::raft::leader::{LeaderWatch, Leadership};
use crate::raft::peers::PeerChannels;
use coord_proto::metadata::RequestSession;

use crate::ops::limits::Limits;
use crate::ops::request_id::{self, FORWARDED_HEADER};
use crate::serve::namespace::{self, Ns};
use crate::serve::write_rate::WriteRates;
use calls::{
    caller_deadline, client_key, served_in, surface_of_agents_that_never_retry,
    waits_on_the_service,
};
use coord_raft_store::storage::StateReader;

/// How long before a caller's deadline its call is answered DEADLINE_EXCEEDED. tonic's server
/// answers a call whose `grpc-timeout` expires CANCELLED, where gRPC (and TensorFlow's own
/// service) answer DEADLINE_EXCEEDED: answering a little earlier gives the caller the right code.
const DEADLINE_MARGIN: Duration = Duration::from_millis(10);

/// Whether a request changes state (and therefore needs a request id).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
}

/// A call [`Router::route`] admitted: what it read off the request, and the message.
struct Admitted<Req> {
    /// Held while the call runs (the client's share of waiting calls).
    permit: Option<crate::ops::limits::Permit>,
    ns: Ns,
    call: Call,
    deadline: Option<Duration>,
    given_id: Option<RequestId>,
    msg: Req,
}

/// How one call is driven (see [`Router::route`]).
struct Call {
    kind: Kind,
    /// It may wait on the service for long (a barrier, a blocking get).
    waits: bool,
    /// jaxlib's: held rather than failed UNAVAILABLE.
    patient: bool,
    /// Another replica admitted it and forwarded it here.
    forwarded: bool,
}

pub struct Router {
    me: u64,
    leader: LeaderWatch,
    channels: PeerChannels,
    session: Arc<RequestSession>,
    leader_wait: Duration,
    metrics: Arc<Metrics>,
    limits: Arc<Limits>,
    authz: crate::ops::authz::Authz,
    /// The applied state, to refuse a call to a namespace that does not exist.
    reader: StateReader,
    /// Each namespace's write rate, held where writes are proposed.
    rates: WriteRates,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(100);
/// How long a replica that sees no leader at all holds a request before answering UNAVAILABLE
/// (longer than an ordinary election, which ends well within it).
const NO_LEADER_WAIT: Duration = Duration::from_millis(1500);
/// How long a follower waits for the leader's answer to a forwarded call that should answer at
/// once before it tells the client UNAVAILABLE (so the client tries another replica): past this,
/// its link to the leader is likely cut in one direction. Calls that wait (see
/// [`calls::waits_on_the_service`]) are not limited.
const QUICK_FORWARD_TIMEOUT: Duration = Duration::from_secs(2);
/// "No deadline" for a wait that ends on an event.
const FOREVER: Duration = Duration::from_secs(86_400 * 365);

impl Router {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        me: u64,
        leader: LeaderWatch,
        leader_wait: Duration,
        metrics: Arc<Metrics>,
        channels: PeerChannels,
        limits: Arc<Limits>,
        authz: crate::ops::authz::Authz,
        reader: StateReader,
    ) -> Self {
        Self {
            me,
            leader,
            channels,
            session: request_id::local_session(),
            leader_wait,
            metrics,
            limits,
            authz,
            reader,
            rates: WriteRates::default(),
        }
    }

    /// The namespace `req` acts in: over TLS a task certificate's own (a header naming another
    /// is refused); else the `coord-namespace` header, which a forward from another replica
    /// carries as that replica resolved it.
    pub fn namespace_of<T>(&self, req: &Request<T>) -> Result<Ns, Status> {
        let header = match req.metadata().get(coord_proto::metadata::NAMESPACE) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| {
                Status::invalid_argument(format!(
                    "header {} is not ASCII",
                    coord_proto::metadata::NAMESPACE
                ))
            })?),
        };
        let named = header.map(|h| namespace::parse(Some(h))).transpose()?;
        self.authz.in_namespace(req, named)
    }

    /// On the leader, before a call of a namespace is served: refuses it if the namespace does
    /// not exist, and a write past the namespace's rate.
    fn check_namespace(&self, kind: Kind) -> Result<(), CoordError> {
        let Some(name) = namespace::current() else {
            return Ok(());
        };
        let rate = self.reader.read(|a| {
            a.state
                .namespaces
                .get(&name)
                .map(|n| (n.limits.writes_per_sec, n.limits.write_burst))
        });
        match rate {
            None => {
                // A deleted namespace's name may come back fresh: with a full bucket.
                self.rates.retain(|n| n != &*name);
                Err(coord_raft_store::state::namespace_not_found(&name).into())
            }
            Some((per_sec, burst)) if kind == Kind::Write => self.rates.take(&name, per_sec, burst),
            Some(_) => Ok(()),
        }
    }

    /// Who may do what on this replica.
    pub fn authz(&self) -> &crate::ops::authz::Authz {
        &self.authz
    }

    /// Over TLS, refuses a task's certificate acting as another task than `task`, which `method`
    /// names in `field` (see [`crate::ops::authz`]); a request that names none is left to the call.
    pub fn check_task<T>(
        &self,
        req: &Request<T>,
        method: &'static str,
        field: &str,
        task: Option<&coord_proto::tensorflow::CoordinatedTask>,
    ) -> Result<(), Status> {
        let Some(t) = task else {
            return Ok(());
        };
        let check = self
            .authz
            .acting_as(req, method, field, &t.job_name, i64::from(t.task_id));
        self.checked(method, check)
    }

    /// Passes on the outcome of an authorization check of `method`, counting a refusal in the
    /// metrics as a call that ended with its code.
    pub fn checked(&self, method: &'static str, check: Result<(), Status>) -> Result<(), Status> {
        if let Err(s) = &check {
            self.metrics.record_rpc(method, s.code(), Duration::ZERO);
        }
        check
    }

    pub fn leadership(&self) -> Leadership {
        self.leader.current()
    }

    /// Runs `req` on the leader: `local` when this replica leads, `remote` (a call of the same
    /// method on the leader's channel) otherwise. Records the RPC in the metrics.
    ///
    /// Everything read off the request (admission, namespace, deadline, request id) is read here,
    /// before the call's future is built: that future holds only the message and what was read,
    /// not the request's metadata, and not twice over as an `async fn`'s arguments are (a parked
    /// call keeps its future for as long as it waits). For the same reason a caller's `local`
    /// future is best built of combinators: an `async` block keeps room for every value it
    /// captures for as long as it runs, even one it has moved into what it awaits.
    pub fn route<'a, Req, Resp, L, LF, R, RF>(
        &'a self,
        method: &'static str,
        kind: Kind,
        req: Request<Req>,
        local: L,
        remote: R,
    ) -> impl Future<Output = Result<Response<Resp>, Status>> + 'a
    where
        Req: Clone + 'a,
        Resp: 'a,
        L: Fn(Req, Option<RequestId>) -> LF + 'a,
        LF: Future<Output = Result<Resp, CoordError>> + 'a,
        R: Fn(PeerChannel, Request<Req>) -> RF + 'a,
        RF: Future<Output = Result<Response<Resp>, Status>> + 'a,
    {
        let started = std::time::Instant::now();
        let a = match self.admit(method, kind, req) {
            Ok(a) => a,
            Err(s) => {
                self.metrics.record_rpc(method, s.code(), started.elapsed());
                return Either::Left(std::future::ready(Err(s)));
            }
        };
        // Built of combinators, not an `async` block: a block keeps room for every value it
        // captures for as long as it runs, even those it hands on to the drive, and a parked call
        // keeps this future for as long as it waits. The drive is answered before the
        // transport's own timer fires, which would answer CANCELLED; without a deadline it runs
        // under an instant that never comes. Everything the call does, here or on the leader,
        // acts in its namespace.
        let Admitted {
            permit,
            ns,
            call,
            deadline,
            given_id,
            msg,
        } = a;
        let limit = deadline.map(|d| d.saturating_sub(DEADLINE_MARGIN));
        let driven = tokio::time::timeout(
            limit.unwrap_or(FOREVER),
            namespace::within(ns, self.drive(call, msg, given_id, local, remote)),
        );
        Either::Right(futures::FutureExt::map(driven, move |timed| {
            let result = timed.unwrap_or_else(|_| {
                Err(Status::deadline_exceeded(format!(
                    "{method}: the caller's deadline ({:?}) expired before the call completed",
                    deadline.unwrap_or_default()
                )))
            });
            // The client's share of waiting calls is given back only now.
            drop(permit);
            let code = result.as_ref().map_or_else(Status::code, |_| Code::Ok);
            self.metrics.record_rpc(method, code, started.elapsed());
            result.map(Response::new)
        }))
    }

    /// What [`Self::route`] reads off a request before driving it; a refusal as its status.
    fn admit<Req>(
        &self,
        method: &'static str,
        kind: Kind,
        req: Request<Req>,
    ) -> Result<Admitted<Req>, Status> {
        // A forward is a call another replica already admitted and checked. Over TLS the mark
        // counts only from a replica's certificate; a client setting it gains nothing.
        let forwarded =
            req.metadata().contains_key(FORWARDED_HEADER) && self.authz.from_replica(&req);
        // Admitted where it entered the ensemble: a forward from another replica passes.
        let permit = if forwarded {
            None
        } else {
            self.limits
                .admit(client_key(&req), method, waits_on_the_service(method))?
        };
        let ns = served_in(method, self.namespace_of(&req)?);
        // jaxlib's and TensorFlow's clients fail on an UNAVAILABLE; coord's try another replica.
        let patient = surface_of_agents_that_never_retry(method)
            && !req
                .metadata()
                .contains_key(coord_proto::metadata::FAILS_OVER);
        let given_id = match kind {
            Kind::Write => request_id::from_metadata(req.metadata())?,
            Kind::Read => None,
        };
        Ok(Admitted {
            permit,
            ns,
            call: Call {
                kind,
                waits: waits_on_the_service(method),
                patient,
                forwarded,
            },
            deadline: caller_deadline(&req),
            given_id,
            msg: req.into_inner(),
        })
    }

    /// Not an `async fn`: one keeps its arguments beside the copies its body makes, and a parked
    /// call keeps this future for as long as it waits.
    #[allow(clippy::manual_async_fn)]
    fn drive<'s, Req, Resp, L, LF, R, RF>(
        &'s self,
        call: Call,
        msg: Req,
        given_id: Option<RequestId>,
        local: L,
        remote: R,
    ) -> impl Future<Output = Result<Resp, Status>> + 's
    where
        Req: Clone + 's,
        Resp: 's,
        L: Fn(Req, Option<RequestId>) -> LF + 's,
        LF: Future<Output = Result<Resp, CoordError>> + 's,
        R: Fn(PeerChannel, Request<Req>) -> RF + 's,
        RF: Future<Output = Result<Response<Resp>, Status>> + 's,
    {
        async move {
            let Call {
                kind,
                waits,
                patient,
                forwarded,
            } = call;
            // A write that arrived without an id gets one of ours; the ticket lives as long as we
            // drive the request.
            let ticket = (kind == Kind::Write && given_id.is_none()).then(|| self.session.begin());
            let id = given_id.or(ticket.as_ref().map(|t| request_id::to_request_id(&t.id)));

            let mut failing_since: Option<Instant> = None;
            let mut leaderless_since: Option<Instant> = None;
            let mut backoff = FIRST_BACKOFF;
            loop {
                let seen = self.leader.current();
                let failure: Status = match &seen {
                    Leadership::Me => {
                        // If leadership lapses mid-call, the outcome is left to the log and the call is
                        // driven again (same request id) wherever leadership went.
                        let outcome = tokio::select! {
                            r = async {
                                self.check_namespace(kind)?;
                                local(msg.clone(), id).await
                            } => r,
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
                        // A forward lives only as long as this replica believes in that leader: one
                        // that lost its leader (a one-way partition, a leader that stopped answering)
                        // drives the request again instead of waiting on a call that may never come
                        // back. The request id makes the second attempt safe.
                        let patience = if waits {
                            FOREVER
                        } else {
                            QUICK_FORWARD_TIMEOUT
                        };
                        // Boxed: a tonic call's state is several KiB, and a call parked on the
                        // leader would otherwise carry room for it.
                        let outcome = tokio::select! {
                            r = Box::pin(self.forward(addr, &msg, id, &remote)) => r,
                            () = tokio::time::sleep(patience) => {
                                let s = Status::unavailable(format!(
                                    "replica {} got no answer from leader {leader} within {} ms; try another replica",
                                    self.me,
                                    patience.as_millis()
                                ));
                                if !patient {
                                    return Err(s);
                                }
                                Err(s)
                            }
                            now = self.leader.changed_from(&seen, Instant::now() + FOREVER) => Err(Status::unavailable(format!(
                                "the leader this replica forwarded to is no longer its leader (now {now:?})"
                            ))),
                        };
                        match outcome {
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
                // A patient call is held until a leader serves it or its client gives up (and drops
                // the call).
                let wait = if patient { FOREVER } else { self.leader_wait };
                let mut give_up_at = since + wait;
                if seen == Leadership::Unknown && !patient {
                    // Without a leader in sight for a while, this replica is likely cut off (a
                    // candidate that cannot win); the client does better trying another replica.
                    give_up_at = give_up_at
                        .min(*leaderless_since.get_or_insert_with(Instant::now) + NO_LEADER_WAIT);
                } else {
                    leaderless_since = None;
                }
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
        R: Fn(PeerChannel, Request<Req>) -> RF,
        RF: Future<Output = Result<Response<Resp>, Status>>,
    {
        let channel = self.channels.in_turn(addr).map_err(Status::internal)?;
        let mut req = Request::new(msg.clone());
        if let Ok(v) = self.me.to_string().parse() {
            req.metadata_mut().insert(FORWARDED_HEADER, v);
        }
        if let Some(id) = &id {
            request_id::to_metadata(id, req.metadata_mut());
        }
        if let Some(ns) = namespace::current() {
            if let Ok(v) = ns.parse() {
                req.metadata_mut()
                    .insert(coord_proto::metadata::NAMESPACE, v);
            }
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

//! A client of a coord ensemble that survives the loss of any replica.
//!
//! It holds a lazily connected channel to every replica and sends each call to the replica it
//! believes leads (any replica would do: followers forward, but the leader saves a hop). When a
//! call fails because the replica is gone or no leader is elected, it follows the leader hint in
//! the error, or tries the next replica, and sends the *same* request again — mutations carry a
//! request id in metadata, so a retry is applied at most once. A call that should answer at once
//! but does not within [`ClientOptions::attempt_timeout`] goes to the next replica the same way (a
//! replica behind a one-way partition accepts calls it cannot complete), unless that replica has
//! just answered another of the client's writes: then it is serving, and the call waits its turn
//! in a burst there (`progress`). The caller sees
//! `UNAVAILABLE` only when no replica could serve the call for
//! [`ClientOptions::unavailable_after`].
//!
//! This module keeps that failover (the client, its options, and the one loop every call goes
//! through); the calls themselves sit in submodules, one per service:
//!
//! - `kv`: the key-value store (TensorFlow's key-value calls, increment, watch).
//! - `tasks`: the coordination service (task lifecycle, barriers, errors, task states).
//! - `admin`: the ensemble's administration (status, membership, snapshots, service shutdown).
//! - `namespaces`: declaring, deleting and listing namespaces.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_proto::metadata::{RequestSession, Ticket, LEADER_ADDR};
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

/// A connection to one replica: writes coalesced, and a request's end sent with its message
/// (see `coord_proto::conn`).
pub(crate) type Channel = coord_proto::conn::EagerEnd<tonic::transport::Channel>;

mod admin;
pub mod kv;
mod namespaces;
mod progress;
mod tasks;

/// Largest message the client sends or accepts (a value near the server's 4 MiB default limit
/// plus its key).
const MESSAGE_LIMIT: usize = 64 << 20;

#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Every replica's gRPC address: `host:port`, or a URL, `http://host:port` or
    /// `https://host:port`, whose scheme must agree with [`ClientOptions::tls`] (see
    /// [`coord_proto::tls::endpoint_addrs`]). The client works with, and prints, `host:port`.
    pub endpoints: Vec<String>,
    /// How long calls keep retrying while no replica can serve them.
    pub unavailable_after: Duration,
    pub connect_timeout: Duration,
    /// How long one attempt of a call that should answer at once (everything but the calls that
    /// wait: blocking get, barrier, WaitForAllTasks, ShutdownTask, error polling) may take before
    /// the client gives up on that replica and sends the same request to the next one. A replica
    /// behind a one-way partition may accept a call and never answer it.
    pub attempt_timeout: Duration,
    /// TLS toward the replicas; `None` speaks plain gRPC.
    pub tls: Option<coord_proto::tls::ClientTls>,
    /// The namespace every call acts in (`None`: the default one), sent as the
    /// `coord-namespace` header on every call.
    pub namespace: Option<String>,
}

impl ClientOptions {
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            unavailable_after: Duration::from_secs(30),
            connect_timeout: Duration::from_millis(500),
            attempt_timeout: Duration::from_secs(2),
            tls: None,
            namespace: None,
        }
    }
}

#[derive(Clone)]
pub struct CoordClient {
    inner: Arc<Inner>,
}

struct Inner {
    /// The replicas' addresses as `host:port`, whatever form they were given in: leader hints and
    /// member lists name replicas this way.
    endpoints: Vec<String>,
    channels: Vec<Channel>,
    /// Index of the replica calls go to first.
    preferred: AtomicUsize,
    session: Arc<RequestSession>,
    /// Which replicas answered writes lately: an attempt there goes on past its timeout.
    progress: progress::Progress,
    options: ClientOptions,
    /// [`ClientOptions::namespace`] as the header's value.
    namespace: Option<tonic::metadata::AsciiMetadataValue>,
}

impl CoordClient {
    /// Creates the client; no connection is made until the first call. Endpoints that cannot be
    /// used (malformed, or a URL scheme that disagrees with the TLS configuration) are refused
    /// here, as INVALID_ARGUMENT naming the endpoint.
    pub fn new(options: ClientOptions) -> Result<Self, Status> {
        if options.endpoints.is_empty() {
            return Err(Status::invalid_argument("no coordinator endpoints given"));
        }
        let endpoints = coord_proto::tls::endpoint_addrs(&options.endpoints, options.tls.is_some())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let channels = endpoints
            .iter()
            .map(|addr| channel(addr, &options))
            .collect::<Result<Vec<_>, _>>()?;
        let namespace =
            match &options.namespace {
                None => None,
                Some(ns) => Some(ns.parse().map_err(|_| {
                    Status::invalid_argument(format!("namespace {ns:?} is not ASCII"))
                })?),
            };
        let progress = progress::Progress::new(endpoints.len());
        Ok(Self {
            inner: Arc::new(Inner {
                progress,
                endpoints,
                channels,
                preferred: AtomicUsize::new(0),
                session: RequestSession::new(rand::random::<u64>() | 1),
                options,
                namespace,
            }),
        })
    }

    /// The replicas' addresses, `host:port`, in the order given (the order `status_of` and
    /// `snapshot_of` index).
    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// Asks the replicas who leads and sends calls there from now on. Best effort: a client that
    /// skips this still works, through a follower.
    pub async fn find_leader(&self) -> Option<String> {
        for i in 0..self.inner.endpoints.len() {
            let Ok(status) = self.status_of(i).await else {
                continue;
            };
            let Some(leader) = status.leader_id else {
                continue;
            };
            let addr = status
                .members
                .iter()
                .find(|m| m.id == leader)
                .map(|m| m.addr.clone())?;
            if let Some(j) = self.index_of(&addr) {
                self.inner.preferred.store(j, Ordering::Relaxed);
            }
            return Some(addr);
        }
        None
    }

    /// The channel to replica `replica` (an index into the endpoints), for calls meant for that
    /// replica alone.
    fn channel_of(&self, replica: usize) -> Result<Channel, Status> {
        self.inner
            .channels
            .get(replica)
            .cloned()
            .ok_or_else(|| Status::invalid_argument(format!("no endpoint #{replica}")))
    }

    fn index_of(&self, addr: &str) -> Option<usize> {
        self.inner.endpoints.iter().position(|e| e == addr)
    }

    /// A mutation of the coordination service, sent with a fresh request id.
    async fn mutate<Req, Resp, F, Fut>(&self, req: Req, f: F) -> Result<Resp, Status>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let ticket = self.inner.session.begin();
        self.call(req, Some(&ticket), f).await
    }

    /// A mutation that may wait on the service (a barrier, WaitForAllTasks, ShutdownTask).
    async fn mutate_parked<Req, Resp, F, Fut>(&self, req: Req, f: F) -> Result<Resp, Status>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let ticket = self.inner.session.begin();
        self.call_parked(req, Some(&ticket), f).await
    }

    /// Sends a call of any coord service with this client's failover. A `mutation` gets a request
    /// id, so however often it is re-sent it applies once; a call that `waits` on the service
    /// (barrier, blocking get, error poll) has no attempt timeout. This is what a proxy in front of
    /// the ensemble uses.
    pub async fn forward<Req, Resp, F, Fut>(
        &self,
        req: Req,
        mutation: bool,
        waits: bool,
        f: F,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let ticket = mutation.then(|| self.inner.session.begin());
        let limit = (!waits).then_some(self.inner.options.attempt_timeout);
        self.call_with(req, ticket.as_ref(), limit, f).await
    }

    /// Like [`CoordClient::forward`], but a mutation takes its request id from `session` (one of
    /// [`CoordClient::new_session`]'s) instead of the client's own: a proxy serving many
    /// connections gives each its own session, so that each is a client of its own to the
    /// ensemble. `session` `None`: a read.
    pub async fn forward_in<Req, Resp, F, Fut>(
        &self,
        session: Option<&Arc<RequestSession>>,
        req: Req,
        waits: bool,
        f: F,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let ticket = session.map(RequestSession::begin);
        let limit = (!waits).then_some(self.inner.options.attempt_timeout);
        self.call_with(req, ticket.as_ref(), limit, f).await
    }

    /// `n` request numbers for the commands one call carries several of, each applied once
    /// however often the call is sent again, and the call's own (the ensemble takes the numbers
    /// under the call's client id, so all come from one lane of the session); keep the tickets
    /// until the call is answered.
    pub(crate) fn tickets(&self, n: usize) -> (Vec<Ticket>, Ticket) {
        let mut tickets = self.inner.session.begin_many(n + 1);
        let call = tickets.pop().unwrap_or_else(|| self.inner.session.begin());
        (tickets, call)
    }

    /// A session of request ids under a client id of its own, for [`CoordClient::forward_in`].
    pub fn new_session() -> Arc<RequestSession> {
        RequestSession::new(rand::random::<u64>() | 1)
    }

    /// A call that answers at once (see [`ClientOptions::attempt_timeout`]).
    async fn call<Req, Resp, F, Fut>(
        &self,
        req: Req,
        ticket: Option<&Ticket>,
        f: F,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        self.call_with(req, ticket, Some(self.inner.options.attempt_timeout), f)
            .await
    }

    /// A call that may wait on the service for as long as it takes.
    async fn call_parked<Req, Resp, F, Fut>(
        &self,
        req: Req,
        ticket: Option<&Ticket>,
        f: F,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        self.call_with(req, ticket, None, f).await
    }

    async fn call_with<Req, Resp, F, Fut>(
        &self,
        req: Req,
        ticket: Option<&Ticket>,
        attempt_timeout: Option<Duration>,
        f: F,
    ) -> Result<Resp, Status>
    where
        Req: Clone,
        F: Fn(Channel, Request<Req>) -> Fut,
        Fut: Future<Output = Result<Response<Resp>, Status>>,
    {
        let n = self.inner.channels.len();
        let mut at = self.inner.preferred.load(Ordering::Relaxed) % n;
        let mut failing_since: Option<Instant> = None;
        let mut backoff = Duration::from_millis(10);
        loop {
            let mut r = Request::new(req.clone());
            if let Some(t) = ticket {
                t.id.write(r.metadata_mut());
            }
            r.metadata_mut().insert(
                coord_proto::metadata::FAILS_OVER,
                tonic::metadata::MetadataValue::from_static("1"),
            );
            if let Some(ns) = &self.inner.namespace {
                r.metadata_mut()
                    .insert(coord_proto::metadata::NAMESPACE, ns.clone());
            }
            let attempt = f(self.inner.channels[at].clone(), r);
            let answer = match attempt_timeout {
                None => attempt.await,
                Some(limit) => self.answer_within(at, limit, attempt).await,
            };
            let status = match answer {
                Ok(resp) => {
                    if ticket.is_some() {
                        self.inner.progress.committed(at, Instant::now());
                    }
                    self.inner.preferred.store(at, Ordering::Relaxed);
                    return Ok(resp.into_inner());
                }
                Err(s) if retryable(&s) => s,
                Err(s) => return Err(s),
            };
            let since = *failing_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.inner.options.unavailable_after {
                return Err(Status::unavailable(format!(
                    "no coordinator replica could serve the call for {:?} (tried {}); last error from {}: {}",
                    self.inner.options.unavailable_after,
                    self.inner.endpoints.join(", "),
                    self.inner.endpoints[at],
                    describe(&status)
                )));
            }
            match status
                .metadata()
                .get(LEADER_ADDR)
                .and_then(|v| v.to_str().ok())
                .and_then(|a| self.index_of(a))
            {
                Some(leader) if leader != at => at = leader,
                _ => {
                    at = (at + 1) % n;
                    tokio::time::sleep(jittered(backoff)).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    }

    /// An attempt's answer from replica `at`, or UNAVAILABLE once it has gone `limit` without one
    /// while the replica answered none of this client's writes: one that commits writes is
    /// serving and the call waits its turn there (see `progress`). However busy the replica, one
    /// attempt is given up after [`ClientOptions::unavailable_after`].
    async fn answer_within<Resp>(
        &self,
        at: usize,
        limit: Duration,
        attempt: impl Future<Output = Result<Response<Resp>, Status>>,
    ) -> Result<Response<Resp>, Status> {
        let sent = Instant::now();
        let most = self.inner.options.unavailable_after.max(limit);
        tokio::pin!(attempt);
        let mut until = sent + limit;
        loop {
            if let Ok(answer) = tokio::time::timeout_at(until, &mut attempt).await {
                return answer;
            }
            let now = Instant::now();
            let serving = self.inner.progress.committed_within(at, limit, now);
            if !serving || now.duration_since(sent) >= most {
                return Err(Status::unavailable(format!(
                    "no answer from {} within {:?}",
                    self.inner.endpoints[at],
                    now.duration_since(sent)
                )));
            }
            until = (now + limit).min(sent + most);
        }
    }
}

/// A lazily connected channel to the replica at `addr` (`host:port`).
fn channel(addr: &str, options: &ClientOptions) -> Result<Channel, Status> {
    let endpoint = coord_proto::tls::endpoint(addr, options.tls.as_ref())
        .map_err(|e| Status::invalid_argument(format!("endpoint {addr:?}: {e}")))?
        .connect_timeout(options.connect_timeout)
        // The replicas' own windows: with HTTP/2's default 64 KiB for the whole connection, a
        // sidecar carrying many tasks gets a job's WaitForAllTasks answers (hundreds of KB each
        // at 30,000 tasks) one window per round trip, shared by all of them.
        .initial_stream_window_size(Some(8 << 20))
        .initial_connection_window_size(Some(16 << 20))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let endpoint = coord_proto::conn::for_many_calls(endpoint);
    Ok(coord_proto::conn::EagerEnd(
        coord_proto::conn::connect_lazy(&endpoint, None),
    ))
}

/// A retry pause drawn at random from [`d`/2, `d`]: thousands of clients that lost their leader
/// together do not all come back in the same millisecond.
pub fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::Rng::gen_range(&mut rand::thread_rng(), 0.5..=1.0))
}

fn tf_client(ch: Channel) -> CoordinationServiceClient<Channel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(MESSAGE_LIMIT)
        .max_encoding_message_size(MESSAGE_LIMIT)
}

/// Failures after which the same request may be sent again: the replica is unreachable or has no
/// leader, or the connection broke mid-call; never an answer of the service. Resending is safe
/// because mutations carry their request id.
fn retryable(s: &Status) -> bool {
    coord_proto::metadata::is_retryable(s)
}

/// A status's message with the chain of errors behind it: a connection failure says only
/// "transport error" on its own, the reason (a refused certificate, a closed connection) is in
/// its sources.
pub(crate) fn describe(status: &Status) -> String {
    let mut text = status.message().to_string();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// URL endpoints are dialled, matched and printed as `host:port`; one the TLS configuration
    /// cannot honour is refused at construction, by name, as a bad argument.
    #[tokio::test]
    async fn endpoints_are_kept_as_host_and_port() {
        let given = ["http://127.0.0.1:7101/", "127.0.0.1:7102"].map(String::from);
        let client = CoordClient::new(ClientOptions::new(given.to_vec())).expect("client");
        assert_eq!(client.endpoints(), ["127.0.0.1:7101", "127.0.0.1:7102"]);
        assert_eq!(client.index_of("127.0.0.1:7101"), Some(0));

        let https = vec!["https://127.0.0.1:7101".to_string()];
        let err = CoordClient::new(ClientOptions::new(https))
            .err()
            .expect("https without TLS");
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(
            err.message().contains("\"https://127.0.0.1:7101\""),
            "{err}"
        );
        assert!(err.message().contains("--tls-ca"), "{err}");
    }

    #[test]
    fn retry_pauses_are_spread_over_the_upper_half_of_the_backoff() {
        let d = Duration::from_millis(200);
        let pauses: Vec<Duration> = (0..1000).map(|_| jittered(d)).collect();
        assert!(pauses.iter().all(|p| *p >= d / 2 && *p <= d));
        // Spread out, not one value: the lowest and highest of 1,000 draws are far apart.
        let (lo, hi) = (pauses.iter().min(), pauses.iter().max());
        assert!(
            hi.zip(lo).is_some_and(|(h, l)| *h - *l > d / 4),
            "{lo:?}..{hi:?}"
        );
    }
}

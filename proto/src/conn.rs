//! gRPC connections between coord's processes: fewer, larger socket writes, and the preface
//! that tells a replica a connection carries Raft traffic.
//!
//! **Coalesced writes.** HTTP/2 in hyper/h2 flushes its connection whenever its task runs, and
//! under tokio that task runs right after each stream's task that woke it. A unary reply is
//! HEADERS, DATA and trailers, and each of them can end up in a `writev` of its own: at 40k replies
//! a second a replica made 85k `writev`s, one to two per reply, and about half its CPU went to
//! the kernel's TCP path (the receiver's share of a loopback send is charged to the sender, too).
//! [`Coalesced`] holds what the connection writes until it is flushed, and lets a flush pass once
//! through the scheduler before it writes: the other streams whose replies became ready in the
//! same pass (a read-index round releases dozens at once) add theirs, and all of them leave in
//! one write. The pass costs a lone request a few microseconds. Nothing is held past a flush that
//! the connection asked for, and writes larger than the buffer go straight to the socket. Servers
//! wrap accepted connections in it; clients get it from [`connect_lazy`].
//!
//! **A request's end travels with its message.** tonic's client learns that a unary request's
//! body has ended only when it polls the body once more after the message, so hyper sends the
//! message in one DATA frame and the end of the stream in another, often in a later write; and a
//! tonic server runs a unary handler only once the stream has ended (it reads trailers first). A
//! Raft message then reached a follower in two pieces, tens of microseconds apart, and the
//! follower waited for the second. [`EagerEnd`] looks one frame ahead, so the message's DATA
//! frame carries END_STREAM.
//!
//! **The Raft preface.** A replica serves clients and peers on one port, but runs its Raft core
//! on a thread of its own. A replica's Raft connections to its peers begin with [`RAFT_PREFACE`]
//! (before TLS, if any), and the receiving replica serves such connections on its Raft thread
//! instead of the client thread: an AppendEntries then reaches the log and its sync without
//! crossing threads, and heartbeats do not queue behind a burst of client calls.

use std::future::Future;
use std::io::{self, IoSlice};
use std::net::IpAddr;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// The first bytes of a replica's Raft connection to a peer. It cannot begin an HTTP/2 preface
/// (`PRI * HTTP/2.0`) or a TLS record (0x16).
pub const RAFT_PREFACE: &[u8] = b"coord-raft/1\n";

/// The first bytes of a leader's pre-append connection to a follower (the server's
/// `pre_append`); as long as [`RAFT_PREFACE`].
pub const PRE_APPEND_PREFACE: &[u8] = b"coord-apnd/1\n";

/// The first bytes of a replication stream's AppendEntries link (the server's `raft_link`); as
/// long as [`RAFT_PREFACE`].
pub const RAFT_LINK_PREFACE: &[u8] = b"coord-rlnk/1\n";

/// Bytes held before a write goes out without waiting for a flush.
const CAPACITY: usize = 64 * 1024;
/// A buffer larger than this is freed once written out (a busy connection's usual flush, a few
/// dozen replies, fits).
const KEPT_CAPACITY: usize = 16 * 1024;

/// An I/O stream whose writes are gathered until a flush (see the module's docs).
pub struct Coalesced<T> {
    inner: T,
    buf: Vec<u8>,
    /// How much of `buf` has already been written.
    written: usize,
    /// A flush has let the scheduler run once and now writes `buf` out.
    yielded: bool,
}

impl<T> Coalesced<T> {
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            written: 0,
            yielded: false,
        }
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.written
    }
}

impl<T: AsyncWrite + Unpin> Coalesced<T> {
    /// Writes out everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        self.yielded = false;
        // An idle connection keeps no large buffer: a replica may hold thousands of them.
        if self.buf.capacity() > KEPT_CAPACITY {
            self.buf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesced<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesced<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(data)])
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let len: usize = data.iter().map(|s| s.len()).sum();
        if this.pending() > 0 && this.pending() + len > CAPACITY {
            ready!(this.poll_drain(cx))?;
        }
        if this.pending() == 0 && len >= CAPACITY {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, data);
        }
        for s in data {
            this.buf.extend_from_slice(s);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending() > 0 {
            if !this.yielded {
                // Let the tasks that are ready run first, then write what they added as well.
                this.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            ready!(this.poll_drain(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Coalesced<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Streams a connection remembers having reset (HTTP/2's default: 10 in hyper, 50 in h2).
const RESETS_REMEMBERED: usize = 1 << 16;

/// `endpoint` for a connection carrying thousands of calls at once to a replica (a sidecar's, a
/// follower relaying its callers'). A call given up on (its caller gone, an attempt timed out)
/// resets its stream; the replica's answer may already be on its way. h2 drops such an answer
/// quietly only while it remembers the reset, and takes one for a stream it has forgotten as an
/// error of its own, counted over the connection's whole life: past 1,024 it ends the connection
/// with ENHANCE_YOUR_CALM, and every call on it fails RESOURCE_EXHAUSTED (a coord-proxy in front
/// of 12,500 torch ranks did so in their first burst). So resets are remembered by the thousand,
/// and a connection to a replica, which this side chose to trust, is not ended for them.
pub fn for_many_calls(endpoint: Endpoint) -> Endpoint {
    endpoint
        .http2_max_concurrent_reset_streams(RESETS_REMEMBERED)
        .http2_max_local_error_reset_streams(None)
}

/// A channel to `endpoint` whose connections are [`Coalesced`] TCP connections (with
/// `TCP_NODELAY`, from `local` when given), made on first use. TLS, timeouts and HTTP/2 settings
/// are the endpoint's, as with [`Endpoint::connect_lazy`].
pub fn connect_lazy(endpoint: &Endpoint, local: Option<IpAddr>) -> Channel {
    endpoint.connect_with_connector_lazy(Connector::new(local, &[]))
}

/// [`connect_lazy`] for a replica's Raft traffic: every connection begins with [`RAFT_PREFACE`].
pub fn connect_raft_lazy(endpoint: &Endpoint, local: Option<IpAddr>) -> Channel {
    endpoint.connect_with_connector_lazy(Connector::new(local, RAFT_PREFACE))
}

/// Connects TCP for tonic with hyper's own connector, then writes `preface` and wraps the
/// connection in [`Coalesced`] (see [`connect_lazy`]).
#[derive(Clone)]
struct Connector {
    http: HttpConnector,
    /// Written before anything else.
    preface: &'static [u8],
}

impl Connector {
    fn new(local: Option<IpAddr>, preface: &'static [u8]) -> Self {
        let mut http = HttpConnector::new();
        // https endpoints get TLS from tonic, on top of this connection.
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_local_address(local);
        Self { http, preface }
    }
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<TokioIo<Coalesced<TcpStream>>>> + Send>>;

impl tower_service::Service<http::Uri> for Connector {
    type Response = TokioIo<Coalesced<TcpStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.http.poll_ready(cx).map_err(io::Error::other)
    }

    fn call(&mut self, uri: http::Uri) -> Connecting {
        let (connecting, preface) = (self.http.call(uri), self.preface);
        Box::pin(async move {
            let mut tcp = connecting.await.map_err(io::Error::other)?.into_inner();
            tcp.write_all(preface).await?;
            Ok(TokioIo::new(Coalesced::new(tcp)))
        })
    }
}

/// A tonic client service whose request bodies are [`EagerEndBody`]s (see the module's docs).
#[derive(Clone, Debug)]
pub struct EagerEnd<S>(pub S);

impl<S> tower_service::Service<http::Request<tonic::body::Body>> for EagerEnd<S>
where
    S: tower_service::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> S::Future {
        self.0
            .call(req.map(|b| tonic::body::Body::new(EagerEndBody::new(b))))
    }
}

/// A body that, having produced a frame, polls its inner body once more at once, so that it can
/// tell the end of the stream with that frame (`is_end_stream`) instead of after it.
pub struct EagerEndBody<B: http_body::Body> {
    inner: B,
    /// What the inner body produced when it was polled ahead.
    ahead: Option<Option<FrameResult<B>>>,
    /// The inner body has ended.
    ended: bool,
}

type FrameResult<B> =
    Result<http_body::Frame<<B as http_body::Body>::Data>, <B as http_body::Body>::Error>;

impl<B: http_body::Body> EagerEndBody<B> {
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            ahead: None,
            ended: false,
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for EagerEndBody<B>
where
    B::Data: Unpin,
    B::Error: Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<FrameResult<B>>> {
        let this = &mut *self;
        let frame = match this.ahead.take() {
            Some(f) => f,
            None => ready!(Pin::new(&mut this.inner).poll_frame(cx)),
        };
        if frame.is_none() {
            this.ended = true;
        }
        if matches!(frame, Some(Ok(_))) {
            // Pending registers the waker as any poll would; the next poll asks again.
            if let Poll::Ready(next) = Pin::new(&mut this.inner).poll_frame(cx) {
                this.ahead = Some(next);
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.ended
            || matches!(self.ahead, Some(None))
            || (self.ahead.is_none() && self.inner.is_end_stream())
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Small writes are held until a flush and then leave together; a large one goes straight
    /// through; nothing is lost or reordered.
    #[tokio::test]
    async fn writes_are_gathered_until_a_flush() {
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut w = Coalesced::new(a);
        w.write_all(b"one ").await.expect("write");
        w.write_all(b"two ").await.expect("write");
        let mut probe = [0u8; 16];
        let early =
            tokio::time::timeout(std::time::Duration::from_millis(20), b.read(&mut probe)).await;
        assert!(early.is_err(), "nothing may arrive before the flush");
        w.flush().await.expect("flush");
        let big = vec![7u8; CAPACITY + 1];
        w.write_all(&big).await.expect("write");
        w.write_all(b"end").await.expect("write");
        w.shutdown().await.expect("shutdown");
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.expect("read");
        let mut want = b"one two ".to_vec();
        want.extend_from_slice(&big);
        want.extend_from_slice(b"end");
        assert_eq!(got, want);
    }

    /// A unary gRPC body ends with its message: the end is known as soon as the message is out.
    #[tokio::test]
    async fn the_end_is_known_with_the_last_frame() {
        use http_body::Body as _;
        use http_body_util::BodyExt;
        let frames = tokio_stream::iter(vec![Ok::<_, std::convert::Infallible>(
            http_body::Frame::data(bytes::Bytes::from_static(b"message")),
        )]);
        let inner = http_body_util::StreamBody::new(frames);
        let mut body = EagerEndBody::new(inner);
        assert!(!body.is_end_stream());
        let first = body.frame().await.expect("a frame").expect("ok");
        assert_eq!(first.into_data().ok().as_deref(), Some(&b"message"[..]));
        assert!(body.is_end_stream(), "the end is known with the message");
        assert!(body.frame().await.is_none());
        assert!(body.is_end_stream());
    }
}

//! Answers sent after their call's headers: what a call that waits keeps while it waits.
//!
//! A call parked on the leader (a barrier arrival, WaitForAllTasks, a blocking get) used to keep
//! its whole chain of futures until the job arrived: tonic's unary call future (about 1.8 KB),
//! the rewrite layer's, the handler's and the router's. At 100,000 parked tasks that chain was
//! the leader's memory, and releasing them all meant finishing 100,000 tonic calls, each encoding
//! its answer into a fresh 8 KiB buffer.
//!
//! A handler that may wait instead answers at once with [`defer`]: an empty response carrying
//! the routed call as a [`Deferred`] extension. tonic's and the handler's futures end there.
//! [`RewriteLayer`](crate::api::rewrite::RewriteLayer) then polls the call once ([`settle`]): a
//! call that is already done is answered exactly as tonic would have answered it (its message,
//! or a trailers-only error); one that waits gets its headers now and a body that is the call
//! itself, finished into the answer's frame and trailers (an error then travels in the trailers,
//! as gRPC allows after headers). The call's future is unchanged: losing the leader still drives
//! it again, the caller's deadline and a client's cancellation (which drops the body) still end
//! it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tonic::body::Body;
use tonic::codegen::http::{HeaderMap, HeaderValue, Response};
use tonic::Status;

use crate::api::shared_answer::{self, AnswerBytes, Frames, SharedAnswer};

/// A routed call, finished into its encoded answer.
type Call = Pin<Box<dyn Future<Output = Result<Arc<AnswerBytes>, Status>> + Send>>;

/// The extension [`defer`] attaches: the call whose answer the response's body will be. (An
/// extension must be `Clone` and `Sync`; it is taken out once, by [`settle`].)
#[derive(Clone)]
pub struct Deferred(Arc<Mutex<Option<Call>>>);

impl Deferred {
    fn take(&self) -> Option<Call> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// A value a deferred call's future hands on once (its request), held boxed: an `async` block
/// keeps room for every value it captures for as long as it runs, even one it has handed on. Held
/// so, that room is a pointer, and the value's own is given back when it is [taken](Held::take).
pub struct Held<T>(Box<T>);

impl<T> Held<T> {
    pub fn new(value: T) -> Self {
        Self(Box::new(value))
    }

    pub fn take(self) -> T {
        *self.0
    }
}

/// The service behind `me`, owned, for a deferred call's future (it outlives the handler that
/// makes it); gone only while the replica shuts down.
pub fn owned<S>(me: &std::sync::Weak<S>) -> Result<Arc<S>, Status> {
    me.upgrade()
        .ok_or_else(|| Status::unavailable("this replica is shutting down"))
}

/// The handler's answer for `call`, a routed call that may wait: an empty `M` now, with the call
/// attached for [`settle`]. The call's answer is sent from its [`SharedAnswer`] if it carries
/// one, else encoded on its own.
pub fn defer<M, F>(call: F) -> tonic::Response<M>
where
    M: prost::Message + Default + 'static,
    F: Future<Output = Result<tonic::Response<M>, Status>> + Send + 'static,
{
    let finished: Call = Box::pin(futures::FutureExt::map(call, |answer| {
        let mut answer = answer?;
        Ok(match answer.extensions_mut().remove::<SharedAnswer>() {
            Some(SharedAnswer(shared)) => shared,
            None => Arc::new(AnswerBytes::encode(answer.get_ref())),
        })
    }));
    let mut response = tonic::Response::new(M::default());
    response
        .extensions_mut()
        .insert(Deferred(Arc::new(Mutex::new(Some(finished)))));
    response
}

/// `response` ready to send: unchanged unless it carries a [`Deferred`] call, which is polled
/// once now (with `cx`, the caller's stream task, which polls the body later too). Done, it is
/// sent as tonic sends an answer; waiting, the headers go now (offering gzip to a caller that
/// accepts it, as the answer may be compressed) and the body waits on the call.
pub fn settle(mut response: Response<Body>, gzip: bool, cx: &mut Context<'_>) -> Response<Body> {
    let Some(mut call) = response
        .extensions_mut()
        .remove::<Deferred>()
        .and_then(|d| d.take())
    else {
        return response;
    };
    match call.as_mut().poll(cx) {
        Poll::Ready(Ok(answer)) => shared_answer::answered(response, &answer, gzip),
        Poll::Ready(Err(status)) => status.into_http(),
        Poll::Pending => {
            if gzip {
                // Each message says whether it is compressed; the header only allows it.
                response
                    .headers_mut()
                    .insert("grpc-encoding", HeaderValue::from_static("gzip"));
            }
            *response.body_mut() = Body::new(Later::Waiting { call, gzip });
            response
        }
    }
}

/// The body of an answer whose headers went before the call was done.
enum Later {
    /// The call still runs.
    Waiting { call: Call, gzip: bool },
    /// Its answer, being sent.
    Sending(Frames),
}

/// The trailers of a call that ended with `status` after its headers were sent.
fn error_trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        trailers.clear();
        // A status whose message or metadata cannot be a header: its code alone.
        let _ = Status::new(status.code(), "").add_header(&mut trailers);
    }
    trailers
}

impl http_body::Body for Later {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Later::Waiting { call, gzip } = this {
            let frames = match std::task::ready!(call.as_mut().poll(cx)) {
                Ok(answer) => answer.frames(*gzip).0,
                Err(status) => Frames::of([Frame::trailers(error_trailers(&status))]),
            };
            *this = Later::Sending(frames);
        }
        match this {
            Later::Sending(frames) => Pin::new(frames).poll_frame(cx),
            Later::Waiting { .. } => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Later::Sending(f) if f.is_end_stream())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// A response as tonic makes it of `defer`'s answer.
    fn deferred<F>(call: F) -> Response<Body>
    where
        F: Future<
                Output = Result<tonic::Response<coord_proto::tensorflow::BarrierResponse>, Status>,
            > + Send
            + 'static,
    {
        let (_, _message, extensions) = defer(call).into_parts();
        let mut r = Response::new(Body::empty());
        *r.extensions_mut() = extensions;
        r
    }

    /// Asserts `collected` is a whole OK answer whose frame is `frame`.
    fn answered_ok(collected: http_body_util::Collected<Bytes>, frame: &[u8]) {
        let status = collected
            .trailers()
            .and_then(|t| t.get("grpc-status").cloned());
        assert_eq!(status, Some(HeaderValue::from_static("0")));
        assert_eq!(collected.to_bytes().as_ref(), frame);
    }

    fn settled(r: Response<Body>, gzip: bool) -> Response<Body> {
        let waker = futures::task::noop_waker();
        settle(r, gzip, &mut Context::from_waker(&waker))
    }

    fn counter(n: i64) -> tonic::Response<coord_proto::tensorflow::BarrierResponse> {
        tonic::Response::new(coord_proto::tensorflow::BarrierResponse { counter: n })
    }

    #[tokio::test]
    async fn a_call_done_at_once_is_answered_as_tonic_answers() {
        let r = settled(deferred(async { Ok(counter(7)) }), true);
        let (parts, body) = r.into_parts();
        // Too short to gain from gzip: plain, and no encoding offered.
        assert!(parts.headers.get("grpc-encoding").is_none());
        let collected = body.collect().await.expect("body");
        answered_ok(collected, b"\x00\x00\x00\x00\x02\x08\x07");

        let r = settled(
            deferred(async { Err(Status::not_found("barrier \"b\" is gone")) }),
            false,
        );
        assert_eq!(
            r.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"5"[..]),
            "trailers-only, as tonic answers an error"
        );
    }

    #[tokio::test]
    async fn a_waiting_call_sends_its_headers_then_its_answer() {
        let (tx, rx) = tokio::sync::oneshot::channel::<i64>();
        let r = settled(
            deferred(async move {
                let n = rx.await.map_err(|_| Status::cancelled("dropped"))?;
                Ok(counter(n))
            }),
            true,
        );
        assert!(r.headers().get("grpc-status").is_none());
        assert_eq!(
            r.headers().get("grpc-encoding").map(|v| v.as_bytes()),
            Some(&b"gzip"[..]),
            "the answer may come compressed"
        );
        let body = r.into_body();
        assert!(!http_body::Body::is_end_stream(&body));
        let collect = tokio::spawn(async move { body.collect().await });
        tx.send(3).expect("the call waits");
        let collected = collect.await.expect("joined").expect("body");
        answered_ok(collected, b"\x00\x00\x00\x00\x02\x08\x03");
    }

    #[tokio::test]
    async fn a_waiting_call_that_fails_ends_with_its_status_in_the_trailers() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let r = settled(
            deferred(async move {
                let _ = rx.await;
                Err(Status::deadline_exceeded("barrier \"b\" #0 timed out"))
            }),
            false,
        );
        let collect = tokio::spawn(async move { r.into_body().collect().await });
        tx.send(()).expect("the call waits");
        let collected = collect.await.expect("joined").expect("body");
        let trailers = collected.trailers().cloned().expect("trailers");
        assert_eq!(
            trailers.get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"4"[..])
        );
        let message = trailers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(message.contains("timed%20out"), "{message}");
        assert!(collected.to_bytes().is_empty());
    }

    #[test]
    fn other_responses_pass_untouched() {
        let r = settled(Response::new(Body::empty()), true);
        assert!(r.headers().is_empty());
    }
}

//! Answers that every task of a job gets alike, sent from one shared buffer.
//!
//! WaitForAllTasks answers each of a job's N tasks with the whole job's devices. tonic encodes each
//! answer into a buffer of its own and holds it until the client has read it, so N answers of N
//! devices are N² bytes of memory at once (10,000 tasks with one 170-byte device each: 22 GB). A
//! handler instead attaches the answer, encoded once for the whole job, as a [`SharedAnswer`]
//! extension of its response; this layer then sends those bytes as the body by reference, one
//! buffer for every caller, and gzip-compressed (also once) to a caller that accepts gzip, as
//! TensorFlow's and jaxlib's gRPC clients do. Every other response passes untouched.

use std::collections::VecDeque;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use http_body::Frame;
use tonic::body::Body;
use tonic::codegen::http::{HeaderMap, HeaderValue, Request, Response};
use tonic::codegen::Service;

/// A whole answer message, encoded once; its gzip form made on first use.
#[derive(Debug)]
pub struct AnswerBytes {
    plain: Bytes,
    gzip: OnceLock<Option<Bytes>>,
}

impl AnswerBytes {
    pub fn new(plain: Bytes) -> Self {
        Self {
            plain,
            gzip: OnceLock::new(),
        }
    }

    /// The message gzip-compressed (None if compressing failed: it is then sent plain).
    fn gzip(&self) -> Option<&Bytes> {
        self.gzip
            .get_or_init(|| {
                let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                z.write_all(&self.plain).ok()?;
                z.finish().ok().map(Bytes::from)
            })
            .as_ref()
    }
}

/// The extension a handler attaches: send this instead of the response's own message.
#[derive(Clone, Debug)]
pub struct SharedAnswer(pub Arc<AnswerBytes>);

#[derive(Clone, Copy, Debug, Default)]
pub struct SharedAnswerLayer;

impl<S> tower_layer::Layer<S> for SharedAnswerLayer {
    type Service = SharedAnswers<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SharedAnswers { inner }
    }
}

#[derive(Clone, Debug)]
pub struct SharedAnswers<S> {
    inner: S,
}

/// Whether the caller's `grpc-accept-encoding` lists gzip.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-accept-encoding")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|e| e.trim() == "gzip"))
}

/// The gRPC frames of `message` (compressed or not), then the OK trailers.
fn frames(message: &Bytes, compressed: bool) -> VecDeque<Frame<Bytes>> {
    let mut prefix = Vec::with_capacity(5);
    prefix.put_u8(u8::from(compressed));
    prefix.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    VecDeque::from([
        Frame::data(Bytes::from(prefix)),
        Frame::data(message.clone()),
        Frame::trailers(trailers),
    ])
}

/// Yields its frames, then ends.
struct Frames(VecDeque<Frame<Bytes>>);

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// `response` with its body replaced by the shared answer it carries, if any.
fn shared(mut response: Response<Body>, gzip: bool) -> Response<Body> {
    let Some(SharedAnswer(answer)) = response.extensions_mut().remove::<SharedAnswer>() else {
        return response;
    };
    let compressed = if gzip { answer.gzip() } else { None };
    let body = match compressed {
        Some(z) => {
            response
                .headers_mut()
                .insert("grpc-encoding", HeaderValue::from_static("gzip"));
            frames(z, true)
        }
        None => frames(&answer.plain, false),
    };
    *response.body_mut() = Body::new(Frames(body));
    response
}

impl<S, ReqBody> Service<Request<ReqBody>> for SharedAnswers<S>
where
    S: Service<Request<ReqBody>, Response = Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let gzip = accepts_gzip(request.headers());
        let future = self.inner.call(request);
        Box::pin(async move { Ok(shared(future.await?, gzip)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::io::Read;

    async fn sent(response: Response<Body>) -> (HeaderMap, Vec<u8>, Option<HeaderMap>) {
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        (parts.headers, collected.to_bytes().to_vec(), trailers)
    }

    fn with_answer(message: &'static [u8]) -> Response<Body> {
        let mut r = Response::new(Body::empty());
        r.extensions_mut()
            .insert(SharedAnswer(Arc::new(AnswerBytes::new(
                Bytes::from_static(message),
            ))));
        r
    }

    #[tokio::test]
    async fn the_shared_answer_is_the_body_plain_or_gzipped() {
        let (headers, body, trailers) = sent(shared(with_answer(b"\x09abcdefgh"), false)).await;
        assert_eq!(body, b"\x00\x00\x00\x00\x09\x09abcdefgh");
        assert!(headers.get("grpc-encoding").is_none());
        assert_eq!(
            trailers.and_then(|t| t.get("grpc-status").cloned()),
            Some(HeaderValue::from_static("0"))
        );

        let (headers, body, _) = sent(shared(with_answer(b"\x09abcdefgh"), true)).await;
        assert_eq!(
            headers.get("grpc-encoding").map(|v| v.as_bytes()),
            Some(&b"gzip"[..])
        );
        assert_eq!(body[0], 1, "compressed flag");
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        assert_eq!(len, body.len() - 5);
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&body[5..])
            .read_to_end(&mut plain)
            .expect("gunzip");
        assert_eq!(plain, b"\x09abcdefgh");
    }

    #[tokio::test]
    async fn other_responses_pass_untouched() {
        let r = Response::new(Body::empty());
        let (headers, body, _) = sent(shared(r, true)).await;
        assert!(body.is_empty() && headers.is_empty());
    }

    #[test]
    fn gzip_is_taken_only_when_listed() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(
            "grpc-accept-encoding",
            HeaderValue::from_static("identity, deflate, gzip"),
        );
        assert!(accepts_gzip(&h));
        h.insert(
            "grpc-accept-encoding",
            HeaderValue::from_static("identity,gzipx"),
        );
        assert!(!accepts_gzip(&h));
    }
}

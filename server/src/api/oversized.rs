//! Oversized requests answer `RESOURCE_EXHAUSTED`, as gRPC specifies for a message over the
//! receiver's limit.
//!
//! tonic's decoder refuses such a message itself, before any handler runs, and calls it
//! `OUT_OF_RANGE` ("decoded message length too large"). This layer rewrites exactly that answer;
//! every other response passes untouched. The refusal is a trailers-only response (the status in
//! the headers), which is the only place tonic puts a decoding error of a request.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::http::{HeaderValue, Request, Response};
use tonic::codegen::Service;

const OUT_OF_RANGE: &str = "11";
const RESOURCE_EXHAUSTED: &str = "8";

/// Whether a response is tonic's refusal of an oversized request.
fn is_oversized_refusal<B>(response: &Response<B>) -> bool {
    let headers = response.headers();
    headers.get("grpc-status").and_then(|v| v.to_str().ok()) == Some(OUT_OF_RANGE)
        && headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|m| m.contains("too large") || m.contains("too%20large"))
}

#[derive(Clone, Copy, Debug, Default)]
pub struct OversizedLayer;

impl<S> tower_layer::Layer<S> for OversizedLayer {
    type Service = Oversized<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Oversized { inner }
    }
}

#[derive(Clone, Debug)]
pub struct Oversized<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Oversized<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let future = self.inner.call(request);
        Box::pin(async move {
            let mut response = future.await?;
            if is_oversized_refusal(&response) {
                response
                    .headers_mut()
                    .insert("grpc-status", HeaderValue::from_static(RESOURCE_EXHAUSTED));
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_oversized_refusal_is_rewritten() {
        let refusal = Response::builder()
            .header("grpc-status", "11")
            .header(
                "grpc-message",
                "Error, decoded message length too large: found 70000000 bytes, the limit is: 67108864 bytes",
            )
            .body(())
            .expect("response");
        assert!(is_oversized_refusal(&refusal));
        let other = Response::builder()
            .header("grpc-status", "11")
            .header("grpc-message", "index out of range")
            .body(())
            .expect("response");
        assert!(!is_oversized_refusal(&other));
        let ok = Response::builder().body(()).expect("response");
        assert!(!is_oversized_refusal(&ok));
    }
}

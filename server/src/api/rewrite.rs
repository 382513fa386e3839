//! The one layer that rewrites responses after the services have answered: tonic's refusal of an
//! oversized request made `RESOURCE_EXHAUSTED` ([`oversized`](crate::api::oversized)), a
//! shared answer sent from its one buffer ([`shared_answer`](crate::api::shared_answer)), and a
//! call that waits answered after its headers ([`deferred`](crate::api::deferred)).
//!
//! One layer rather than one per rule: every call, parked ones included, carries each layer's
//! future for as long as it runs.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;

use crate::api::{deferred, oversized, shared_answer};

#[derive(Clone, Copy, Debug, Default)]
pub struct RewriteLayer;

impl<S> tower_layer::Layer<S> for RewriteLayer {
    type Service = Rewrite<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Rewrite { inner }
    }
}

#[derive(Clone, Debug)]
pub struct Rewrite<S> {
    inner: S,
}

impl<S, ReqBody> Service<Request<ReqBody>> for Rewrite<S>
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
        use futures::TryFutureExt;
        let gzip = shared_answer::accepts_gzip(request.headers());
        // Combinators, not an async block: a block awaiting `future` would hold it twice. A
        // deferred answer is polled once with the stream task's context: `settle` needs it.
        Box::pin(
            self.inner
                .call(request)
                .map_ok(move |response| shared_answer::shared(oversized::rewritten(response), gzip))
                .and_then(move |response| {
                    let mut response = Some(response);
                    futures::future::poll_fn(move |cx| {
                        Poll::Ready(Ok(response
                            .take()
                            .map(|r| deferred::settle(r, gzip, cx))
                            .unwrap_or_default()))
                    })
                }),
        )
    }
}

//! The one layer that rewrites responses after the services have answered: tonic's refusal of an
//! oversized request made `RESOURCE_EXHAUSTED` ([`oversized`](crate::api::oversized)), and a
//! shared answer sent from its one buffer ([`shared_answer`](crate::api::shared_answer)).
//!
//! One layer rather than one per rule: every call, parked ones included, carries each layer's
//! future for as long as it runs.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::Service;

use crate::api::{oversized, shared_answer};

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
        let gzip = shared_answer::accepts_gzip(request.headers());
        // A combinator, not an async block: a block awaiting `future` would hold it twice.
        Box::pin(futures::TryFutureExt::map_ok(
            self.inner.call(request),
            move |response| shared_answer::shared(oversized::rewritten(response), gzip),
        ))
    }
}

//! Oversized requests answer `RESOURCE_EXHAUSTED`, as gRPC specifies for a message over the
//! receiver's limit.
//!
//! tonic's decoder refuses such a message itself, before any handler runs, and calls it
//! `OUT_OF_RANGE` ("decoded message length too large"). [`rewritten`] (applied to every response by
//! [`RewriteLayer`](crate::api::rewrite::RewriteLayer)) changes exactly that answer; every other
//! response passes untouched. The refusal is a trailers-only response (the status in the headers),
//! which is the only place tonic puts a decoding error of a request.

use tonic::codegen::http::{HeaderValue, Response};

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

/// `response` with tonic's refusal of an oversized request turned `RESOURCE_EXHAUSTED`; any
/// other response as it was.
pub fn rewritten<B>(mut response: Response<B>) -> Response<B> {
    if is_oversized_refusal(&response) {
        response
            .headers_mut()
            .insert("grpc-status", HeaderValue::from_static(RESOURCE_EXHAUSTED));
    }
    response
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

//! Error details as TensorFlow's and XLA's gRPC clients read them.
//!
//! Both build on TSL's gRPC layer, which carries an error's payloads in `grpc-status-details-bin`
//! as a serialized `tensorflow.distributed_runtime.GrpcPayloadContainer`: a map from type URL to
//! a serialized message (in place of `google.rpc.Status`). Every error the coordination service
//! itself produces carries a `CoordinationServiceError` there: its presence is how an agent tells
//! an answer of the service from a broken connection (TensorFlow's agent keeps retrying
//! RegisterTask on errors without it; jaxlib takes them for a lost connection). Barrier errors add
//! a `BarrierError`. The two surfaces differ only in how `CoordinationServiceError` names the
//! task, so each passes its own encoding of it.
//!
//! Routing's own `UNAVAILABLE` ("try again, possibly elsewhere") never gets a payload: it is not
//! an answer of the service.

use bytes::Bytes;
use coord_proto::tensorflow::distributed_runtime::GrpcPayloadContainer;
use prost::Message;
use tonic::{Code, Status};

use crate::error::CoordError;

pub use coord_proto::tensorflow::distributed_runtime::{BARRIER_ERROR_URL, COORDINATION_ERROR_URL};

/// An answer with `code` and `message`, carrying `coordination_error` (an encoded
/// `CoordinationServiceError`) and `extra` payloads.
pub fn with_payloads(
    code: Code,
    message: String,
    coordination_error: Vec<u8>,
    extra: Option<(&str, Vec<u8>)>,
) -> CoordError {
    let mut payloads = vec![(COORDINATION_ERROR_URL, coordination_error)];
    payloads.extend(extra);
    let container = GrpcPayloadContainer {
        payloads: payloads
            .into_iter()
            .map(|(url, v)| (url.to_string(), Bytes::from(v)))
            .collect(),
    };
    CoordError::Detailed {
        code,
        message,
        details: Bytes::from(container.encode_to_vec()),
    }
}

/// `e` as an answer of the service: with an empty `CoordinationServiceError` (the error is the
/// caller's own) and `extra`. Errors routing re-drives, and errors already detailed, pass
/// unchanged.
pub fn detailed_with(e: CoordError, extra: Option<(&str, Vec<u8>)>) -> CoordError {
    if e.is_retryable() || matches!(e, CoordError::Detailed { .. }) {
        return e;
    }
    let message = e.to_string();
    let code = Status::from(e).code();
    with_payloads(code, message, Vec::new(), extra)
}

/// A barrier's error, the barrier named in a `BarrierError` (the same message on both surfaces).
pub fn barrier_error(e: CoordError, barrier_id: &str, counter: i64) -> CoordError {
    let b = coord_proto::tensorflow::BarrierError {
        barrier_id: barrier_id.to_string(),
        counter,
    };
    detailed_with(e, Some((BARRIER_ERROR_URL, b.encode_to_vec())))
}

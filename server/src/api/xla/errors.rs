//! XLA's error details: what jaxlib's client finds in `grpc-status-details-bin`.
//!
//! The trailer holds a serialized `tensorflow.distributed_runtime.GrpcPayloadContainer`, a map
//! from type URL to a serialized `xla.coordination.*` message. Every error the service itself
//! produces carries a `CoordinationServiceError` (jaxlib takes an error without one for a broken
//! connection); barrier errors add a `BarrierError`, a stale service incarnation a
//! `ServiceMismatchError`.

use bytes::Bytes;
use coord_proto::tensorflow::distributed_runtime::GrpcPayloadContainer;
use coord_proto::xla::coordination as xla;
use coord_raft_store::state::{ErrorEvent, TaskError, TaskName};
use prost::Message;
use tonic::{Code, Status};

use crate::error::{grpc_code, CoordError};

const COORDINATION_ERROR_URL: &str = "type.googleapis.com/tensorflow.CoordinationServiceError";
const BARRIER_ERROR_URL: &str = "type.googleapis.com/tensorflow.BarrierError";
const SERVICE_MISMATCH_URL: &str = "type.googleapis.com/tensorflow.ServiceMismatchError";

/// XLA's integer id of a task.
pub fn id_of(t: &TaskName) -> i32 {
    i32::try_from(t.task).unwrap_or(i32::MAX)
}

/// The payload of an error that happened in a task.
pub fn error_payload(e: &TaskError) -> xla::CoordinationServiceError {
    xla::CoordinationServiceError {
        is_reported_error: e.reported,
        source_task_id: id_of(&e.source),
    }
}

/// An answer with `payload` and `extra` in `grpc-status-details-bin`.
fn with_payloads(
    code: Code,
    message: String,
    payload: &xla::CoordinationServiceError,
    extra: Option<(&str, Vec<u8>)>,
) -> CoordError {
    let mut payloads = vec![(COORDINATION_ERROR_URL, payload.encode_to_vec())];
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

fn detailed_with(e: CoordError, extra: Option<(&str, Vec<u8>)>) -> CoordError {
    if e.is_retryable() || matches!(e, CoordError::Detailed { .. }) {
        return e;
    }
    let message = e.to_string();
    let code = Status::from(e).code();
    with_payloads(
        code,
        message,
        &xla::CoordinationServiceError::default(),
        extra,
    )
}

/// A service answer as XLA's client wants it: with a `CoordinationServiceError`. Errors routing
/// must re-drive, and errors already detailed, pass unchanged.
pub fn detailed(e: CoordError) -> CoordError {
    detailed_with(e, None)
}

/// A barrier's error, with the barrier named in a `BarrierError`.
pub fn barrier_error(e: CoordError, barrier_id: &str, counter: i64) -> CoordError {
    let b = xla::BarrierError {
        barrier_id: barrier_id.to_string(),
        counter,
    };
    detailed_with(e, Some((BARRIER_ERROR_URL, b.encode_to_vec())))
}

/// A request made for another service incarnation: INTERNAL, with the service's own.
pub fn service_mismatch(theirs: u64, ours: u64) -> CoordError {
    let mismatch = xla::ServiceMismatchError {
        service_incarnation: ours,
    };
    with_payloads(
        Code::Internal,
        format!("wrong service incarnation: requested {theirs}, currently {ours}"),
        &xla::CoordinationServiceError::default(),
        Some((SERVICE_MISMATCH_URL, mismatch.encode_to_vec())),
    )
}

/// The error a PollForError ends with: another task's failure, named in the payload.
pub fn polled(e: &ErrorEvent) -> CoordError {
    with_payloads(
        grpc_code(e.error.code),
        format!("task {} failed: {}", e.error.source, e.error.message),
        &error_payload(&e.error),
        None,
    )
}

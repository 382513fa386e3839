//! XLA's error details: what jaxlib's client finds in `grpc-status-details-bin` (see
//! [`crate::api::payloads`]). jaxlib names tasks by integer id, so its `CoordinationServiceError`
//! does too; a stale service incarnation adds a `ServiceMismatchError`.

use coord_proto::xla::coordination as xla;
use coord_raft_store::state::{ErrorEvent, TaskError, TaskName};
use prost::Message;
use tonic::{Code, Status};

use crate::api::payloads::{detailed_with, with_payloads};
use crate::error::{grpc_code, CoordError};

pub use crate::api::payloads::barrier_error;

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

/// A service answer as XLA's client wants it: with a `CoordinationServiceError`. Errors routing
/// must re-drive, and errors already detailed, pass unchanged.
pub fn detailed(e: CoordError) -> CoordError {
    detailed_with(e, None)
}

/// An authorization refusal (`PERMISSION_DENIED`, see `ops::authz`) as an answer of the service:
/// with a `CoordinationServiceError`, as every other error of the service. Without it jaxlib takes
/// the refusal for a broken connection and repeats RegisterTask until its `init_timeout` before
/// it fails (jaxlib 0.12 with `init_timeout=20`: the refused process ended after 35 s, against 2 s
/// with the payload). Other errors of the check pass unchanged.
pub fn refused(s: Status) -> Status {
    if s.code() != Code::PermissionDenied {
        return s;
    }
    let message = s.message().to_string();
    Status::from(with_payloads(s.code(), message, Vec::new(), None))
}

/// A request made for another service incarnation: INTERNAL, with the service's own.
pub fn service_mismatch(theirs: u64, ours: u64) -> CoordError {
    let mismatch = xla::ServiceMismatchError {
        service_incarnation: ours,
    };
    with_payloads(
        Code::Internal,
        format!("wrong service incarnation: requested {theirs}, currently {ours}"),
        Vec::new(),
        Some((SERVICE_MISMATCH_URL, mismatch.encode_to_vec())),
    )
}

/// The error a PollForError ends with: another task's failure, named in the payload.
pub fn polled(e: &ErrorEvent) -> CoordError {
    with_payloads(
        grpc_code(e.error.code),
        format!("task {} failed: {}", e.error.source, e.error.message),
        error_payload(&e.error).encode_to_vec(),
        None,
    )
}

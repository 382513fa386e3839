//! Calls that carry several commands, each applied under a request number of its own (a
//! sidecar's tasks' arrivals, a proxy's torch connections' ADDs): how the numbers are checked,
//! what each command's request id is, and how one command's error is told among the others'
//! answers.

use coord_raft_store::RequestId;
use tonic::{Request, Status};

use crate::error::CoordError;
use crate::ops::request_id;

/// Checks that a call numbering the commands it carries (`what`, `n` of them) under its own
/// client does so as it must: one number per command (`seqs`, `numbers` of them) or none, and
/// numbers only under a request id of the caller's own (a replica would number them under its
/// own client, where they could be taken for its other requests).
pub fn numbered<T>(
    req: &Request<T>,
    seqs: &str,
    numbers: usize,
    what: &str,
    n: usize,
) -> Result<(), Status> {
    if numbers == 0 {
        return Ok(());
    }
    if numbers != n {
        return Err(Status::invalid_argument(format!(
            "{seqs}: {numbers} numbers for {n} {what}; send one per item, or none"
        )));
    }
    match request_id::from_metadata(req.metadata()).map_err(Status::from)? {
        Some(_) => Ok(()),
        None => Err(Status::invalid_argument(format!(
            "{seqs} number the {what} under the call's client, but the call carries no {} \
             metadata",
            coord_proto::metadata::REQUEST_ID
        ))),
    }
}

/// An error a call of its own would have ended with, as the code, message and status details an
/// answer among several carries.
pub fn error_fields(e: CoordError) -> (i32, String, Vec<u8>) {
    let s = Status::from(e);
    (
        s.code() as i32,
        s.message().to_string(),
        s.details().to_vec(),
    )
}

/// Command `i`'s request id: its number in `seqs` under the call's client `id`; `None` where the
/// call numbers none (or carries no request id).
pub fn item_id(id: Option<RequestId>, seqs: &[u64], i: usize) -> Option<RequestId> {
    id.zip(seqs.get(i))
        .map(|(id, &seq)| RequestId { seq, ..id })
}

/// A command's outcome among a call's answers, as its own call would have ended: `ok` of its
/// value, or `failed` of its error's code, message and status details; `Err` for an error the
/// whole call must end with (one routing re-drives: the leader changed meanwhile).
pub fn item_answer<T, A>(
    outcome: Result<T, CoordError>,
    ok: impl FnOnce(T) -> A,
    failed: impl FnOnce(i32, String, Vec<u8>) -> A,
) -> Result<A, CoordError> {
    match outcome {
        Ok(v) => Ok(ok(v)),
        Err(e) if e.is_retryable() => Err(e),
        Err(e) => {
            let (code, message, details) = error_fields(e);
            Ok(failed(code, message, details))
        }
    }
}

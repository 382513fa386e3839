//! The vocabulary every layer of the crate shares: the gRPC [`Code`] an outcome carries, the
//! [`OpError`] a refused command returns, and the [`RequestId`] that names a client's request.
//!
//! This module is a leaf: it imports nothing else from the crate, so the dispatcher, the state and
//! the command layer can all speak it without importing one another.

use std::fmt;

use serde::{Deserialize, Serialize};

/// gRPC status codes as the state machine speaks them (it knows nothing of tonic). The values are
/// gRPC's.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    /// The code for a gRPC numeric code; OK and unknown values become `Unknown` (an error
    /// reported with code OK is still an error).
    pub fn from_i32(c: i32) -> Code {
        match c {
            1 => Code::Cancelled,
            3 => Code::InvalidArgument,
            4 => Code::DeadlineExceeded,
            5 => Code::NotFound,
            6 => Code::AlreadyExists,
            7 => Code::PermissionDenied,
            8 => Code::ResourceExhausted,
            9 => Code::FailedPrecondition,
            10 => Code::Aborted,
            11 => Code::OutOfRange,
            12 => Code::Unimplemented,
            13 => Code::Internal,
            14 => Code::Unavailable,
            15 => Code::DataLoss,
            16 => Code::Unauthenticated,
            _ => Code::Unknown,
        }
    }
}

/// A client's request id.
///
/// A client numbers its mutations `seq = 1, 2, ...` and may have several in flight at once. With each
/// request it sends `acked_below`: every request with a smaller `seq` has been answered, so the
/// state machine may forget those results (Raft thesis §6.3, extended to concurrent requests).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RequestId {
    pub client: u64,
    pub seq: u64,
    pub acked_below: u64,
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}#{}", self.client, self.seq)
    }
}

/// Why a command was refused. A deterministic outcome of the command (every replica reaches the
/// same one), not a storage error.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    #[error("key {key:?} already exists")]
    AlreadyExists { key: String },
    #[error("key must not be empty")]
    EmptyKey,
    #[error("value of key {key:?} is not a decimal integer, cannot increment it")]
    NotAnInteger { key: String },
    #[error("incrementing key {key:?} by {delta} overflows a 64-bit integer")]
    Overflow { key: String, delta: i64 },
    /// A coordination-service outcome with its gRPC code (the message names the task or barrier).
    #[error("{message}")]
    Status { code: Code, message: String },
    /// Task and barrier requests before the ensemble set the cluster up.
    #[error("the coordination service has no cluster configuration yet")]
    NoCluster,
    /// The request's result was already delivered and forgotten (its client has acknowledged it),
    /// so this copy is a late duplicate and is not applied again.
    #[error("request {request} is a duplicate of one already answered")]
    StaleDuplicate { request: RequestId },
    /// A blocking pop found the queue empty: not an outcome, the leader parks the call and
    /// applies the same request again later (never remembered against its request id). Appended
    /// last: results are encoded by variant index.
    #[error("queue {key:?} is empty")]
    QueueEmpty { key: String },
}

impl OpError {
    /// A refusal that says "not yet" rather than "no": the same request may be applied again, so
    /// it is not remembered in the client's session.
    pub fn is_transient(&self) -> bool {
        matches!(self, OpError::NoCluster | OpError::QueueEmpty { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_from_grpc_numbers() {
        assert_eq!(Code::from_i32(13), Code::Internal);
        assert_eq!(Code::from_i32(0), Code::Unknown);
    }
}

//! The server's error type and its one conversion to a gRPC status.
//!
//! Every message names the key (or replica) involved. `UNAVAILABLE` is reserved for "try again,
//! possibly elsewhere": no leader, the leader changed, a parked call lost its leader. Routing
//! re-drives exactly those; every other code is an answer.

use coord_raft_store::OpError;
use tonic::{Code, Status};

use coord_proto::metadata::{LEADER_ADDR as LEADER_ADDR_HEADER, LEADER_ID as LEADER_ID_HEADER};

#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("key {key:?} not found")]
    NotFound { key: String },
    #[error(transparent)]
    Op(OpError),
    /// This replica is not the leader (any more).
    #[error("replica {me} is not the leader")]
    NotLeader {
        me: u64,
        leader: Option<(u64, String)>,
    },
    /// The leader lost its leadership while the request was in flight; its outcome is decided by
    /// the log, and a retry with the same request id gets that outcome.
    #[error("leadership changed while the request was in flight")]
    LeaderChanged,
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
    /// A limit of this replica or the store was reached; nothing changed.
    #[error("{0}")]
    ResourceExhausted(String),
    /// An answer with error details for the client (XLA's `GrpcPayloadContainer`, already
    /// serialized).
    #[error("{message}")]
    Detailed {
        code: Code,
        message: String,
        details: bytes::Bytes,
    },
}

impl From<OpError> for CoordError {
    fn from(e: OpError) -> Self {
        match e {
            // The first leader sets the cluster up right after its election; a retry finds it.
            OpError::NoCluster => CoordError::Unavailable(e.to_string()),
            e => CoordError::Op(e),
        }
    }
}

impl CoordError {
    /// An answer of the service with its gRPC code (the message names what it concerns).
    pub fn status(code: coord_raft_store::state::Code, message: String) -> Self {
        CoordError::Op(OpError::Status { code, message })
    }

    /// Whether routing should re-drive the request on the (new) leader.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            CoordError::NotLeader { .. } | CoordError::LeaderChanged | CoordError::Unavailable(_)
        )
    }
}

impl From<CoordError> for Status {
    fn from(e: CoordError) -> Status {
        let retryable = e.is_retryable();
        let mut s = status_of(e);
        // Every answer of the service is marked, so that nobody takes it for a broken hop and
        // sends the request again (see `coord_proto::metadata::FINAL`).
        if !retryable {
            coord_proto::metadata::mark_final(&mut s);
        }
        s
    }
}

fn status_of(e: CoordError) -> Status {
    let message = e.to_string();
    match e {
        CoordError::InvalidArgument(_) => Status::invalid_argument(message),
        CoordError::NotFound { .. } => Status::not_found(message),
        CoordError::Op(op) => Status::new(op_code(&op), message),
        CoordError::NotLeader { leader, .. } => {
            let mut s = Status::unavailable(message);
            if let Some((id, addr)) = leader {
                add_leader_hint(&mut s, id, &addr);
            }
            s
        }
        CoordError::LeaderChanged | CoordError::Unavailable(_) => Status::unavailable(message),
        CoordError::Internal(_) => Status::internal(message),
        CoordError::ResourceExhausted(_) => Status::resource_exhausted(message),
        CoordError::Detailed { code, details, .. } => Status::with_details(code, message, details),
    }
}

fn op_code(e: &OpError) -> Code {
    match e {
        OpError::AlreadyExists { .. } => Code::AlreadyExists,
        OpError::EmptyKey => Code::InvalidArgument,
        OpError::NotAnInteger { .. } => Code::FailedPrecondition,
        OpError::Overflow { .. } => Code::OutOfRange,
        OpError::StaleDuplicate { .. } => Code::FailedPrecondition,
        OpError::Status { code, .. } => grpc_code(*code),
        OpError::NoCluster => Code::Unavailable,
        OpError::QueueEmpty { .. } => Code::FailedPrecondition,
    }
}

/// The state machine's code as tonic's (same numbers).
pub fn grpc_code(c: coord_raft_store::state::Code) -> Code {
    Code::from_i32(c as i32)
}

/// Attaches the leader's id and address so a client can go there directly.
pub fn add_leader_hint(s: &mut Status, id: u64, addr: &str) {
    if let Ok(v) = id.to_string().parse() {
        s.metadata_mut().insert(LEADER_ID_HEADER, v);
    }
    if let Ok(v) = addr.parse() {
        s.metadata_mut().insert(LEADER_ADDR_HEADER, v);
    }
}

//! [`RendezvousError`]: why a rendezvous call failed, in the terms that cross a link (a gRPC code
//! and a message). A leaf every other rendezvous module uses.

use tonic::{Code, Status};

/// Why a rendezvous call failed. It carries a gRPC code so that it crosses a link unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RendezvousError {
    pub code: Code,
    pub message: String,
}

impl RendezvousError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn aborted(message: impl Into<String>) -> Self {
        Self::new(Code::Aborted, message)
    }

    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(Code::Cancelled, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }
}

impl From<RendezvousError> for Status {
    fn from(e: RendezvousError) -> Self {
        Status::new(e.code, e.message)
    }
}

impl From<Status> for RendezvousError {
    fn from(s: Status) -> Self {
        Self::new(s.code(), s.message())
    }
}

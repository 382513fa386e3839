//! TensorFlow's `RendezvousMgr` over direct worker-to-worker links.
//!
//! - [`key`]: rendezvous keys in TF's format, and their parser.
//! - [`tensor`]: dtype, shape and bytes.
//! - [`local`]: the table of one step: sends matched with receives.
//! - [`mgr`]: the manager of a worker's steps (`find`, `recv_local`, `cleanup`), and the
//!   [`RemoteRendezvous`] that fetches a tensor from the task that produced it.
//! - [`link`]: the service every worker runs for its peers (gRPC and the direct link on one
//!   port), and its client.
//! - [`buffers`]: received large tensors' buffers, reused.
//! - [`direct`]: the direct link, `RecvTensor` over plain framed TCP, which receives use first.
//! - [`peers`]: peer heartbeats on the same links; a silent peer fails the receives waiting on it.
//!
//! Tensors never touch a coordinator: the coordination key-value store only tells a worker where
//! its peers' links are (`coord/links/<task>`), and a failover of the ensemble stalls neither a
//! transfer nor a heartbeat.

pub mod buffers;
pub mod direct;
pub mod key;
pub mod link;
pub mod local;
pub mod mgr;
pub mod peers;
pub mod tensor;

pub use key::{DeviceName, ParsedKey};
pub use local::{LocalRendezvous, Received};
pub use mgr::{RemoteRendezvous, RendezvousMgr, WorkerSession};
pub use tensor::{DType, Tensor};

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

#[cfg(test)]
mod tests;

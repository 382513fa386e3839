//! TensorFlow's `RendezvousMgr` over direct worker-to-worker links.
//!
//! The modules, bottom up (each uses only those before it):
//!
//! - [`error`]: [`RendezvousError`], a gRPC code and a message.
//! - [`key`]: rendezvous keys in TF's format, and their parser.
//! - [`tensor`]: dtype, shape and bytes.
//! - [`local`]: the table of one step: sends matched with receives.
//! - [`buffers`]: received large tensors' buffers, reused.
//! - [`wire`]: what both ends of a link agree on: the tensor header both transports send, the
//!   address key, the gRPC limits.
//! - [`direct`]: the direct link, `RecvTensor` over plain framed TCP, which receives use first;
//!   it serves whatever `direct::Producer` answers its calls.
//! - [`links`]: a worker's client side of its peers' links: direct first, gRPC otherwise.
//! - [`mgr`]: the manager of a worker's steps (`find`, `recv_local`, `cleanup`), and the
//!   [`RemoteRendezvous`] that fetches a tensor from the task that produced it.
//! - [`link`]: the service every worker runs for its peers (gRPC and the direct link on one
//!   port), answering from its manager.
//! - [`peers`]: peer heartbeats on the same links; a silent peer fails the receives waiting on it.
//!
//! Tensors never touch a coordinator: the coordination key-value store only tells a worker where
//! its peers' links are (`coord/links/<task>`), and a failover of the ensemble stalls neither a
//! transfer nor a heartbeat.

pub mod buffers;
pub mod direct;
pub mod error;
pub mod key;
pub mod link;
pub mod links;
pub mod local;
pub mod mgr;
pub mod peers;
pub mod tensor;
pub mod wire;

pub use error::RendezvousError;
pub use key::{DeviceName, ParsedKey};
pub use local::{LocalRendezvous, Received};
pub use mgr::{RemoteRendezvous, RendezvousMgr, WorkerSession};
pub use tensor::{DType, Tensor};

#[cfg(test)]
mod tests;

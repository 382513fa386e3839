//! What both ends of a worker link agree on, whichever transport carries a call: where a worker
//! publishes its link's address, the header a tensor answer sends ahead of its bytes (and how a
//! receiver checks it before it allocates anything), and the gRPC transport's limits.
//!
//! The service ([`super::link`]), its client ([`super::links`]) and the direct link
//! ([`super::direct`]) all use it, and it uses none of them: one definition of the header for
//! both transports and both ends.

use coord_proto::coord::link::TensorHeader;
use tonic::Status;

use super::local::Received;
use super::tensor::{self, DType};

/// Bytes of tensor data per streamed message. A tensor up to this size crosses as one message,
/// which tonic decodes into one buffer that becomes the received tensor's bytes (no copy to
/// assemble it); a larger one comes in chunks of this size, assembled at the receiver.
///
/// Small enough that every copy on the way (the producer's encode, tonic's decode buffer, the
/// assembly) works on data still in the CPU cache: measured here with 64 MiB tensors, 256 KiB
/// chunks moved 2.1 GB/s where 4 MiB chunks moved 1.2 (128 KiB: 1.6, 512 KiB: 1.5, one run each).
pub const CHUNK_BYTES: usize = 256 << 10;
/// The largest message either side accepts: a chunk and its framing.
pub(super) const MAX_MESSAGE: usize = CHUNK_BYTES + (64 << 10);
/// HTTP/2 flow-control windows: large enough that a loopback stream is never window-bound.
pub(super) const STREAM_WINDOW: u32 = 16 << 20;
pub(super) const CONNECTION_WINDOW: u32 = 64 << 20;
/// The largest HTTP/2 frame either side accepts: a chunk crosses in one frame, not 16 of the
/// default 16 KiB.
pub(super) const MAX_FRAME: u32 = 1 << 20;

/// The key under which `task` publishes its link address.
pub fn address_key(task: &str) -> String {
    format!("coord/links/{}", task.trim_start_matches('/'))
}

/// What a tensor answer says of the tensor ahead of its bytes (both transports send it).
pub(super) fn header_of(received: &Received) -> TensorHeader {
    TensorHeader {
        dtype: received.tensor.dtype().name().to_string(),
        shape: received.tensor.shape().to_vec(),
        total_bytes: received.tensor.data().len() as u64,
        is_dead: received.is_dead,
    }
}

/// The most a receiver allocates for a tensor before its bytes arrive.
pub(super) const MAX_PREALLOCATED: usize = 1 << 30;

/// The dtype and byte count `header` announces, if they agree with its shape.
pub(super) fn check_header(header: &TensorHeader) -> Result<(DType, u64), Status> {
    let dtype = DType::from_name(&header.dtype)
        .ok_or_else(|| Status::invalid_argument(format!("unknown dtype {:?}", header.dtype)))?;
    let expected = tensor::byte_len(dtype, &header.shape).map_err(Status::invalid_argument)?;
    if expected != header.total_bytes {
        return Err(Status::data_loss(format!(
            "the header announces {} bytes for shape {:?}, which holds {expected}",
            header.total_bytes, header.shape
        )));
    }
    Ok((dtype, expected))
}

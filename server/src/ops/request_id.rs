//! Request ids on the server side: the id a client sent in metadata, or one this replica assigns.
//!
//! A request without an id gets one from the replica that received it, which then drives it to
//! completion itself (routing forwards and re-drives with that same id until the outcome is known),
//! so even a plain client's write is applied once as long as the replica it talks to stays up.

use std::sync::Arc;

use coord_proto::metadata::{RequestSession, WireRequestId};
use coord_raft_store::RequestId;
use tonic::metadata::MetadataMap;

use crate::error::CoordError;

pub use coord_proto::metadata::FORWARDED as FORWARDED_HEADER;

/// The request id the client sent, if any; a malformed one is an error naming the header.
pub fn from_metadata(md: &MetadataMap) -> Result<Option<RequestId>, CoordError> {
    Ok(WireRequestId::read(md)
        .map_err(CoordError::InvalidArgument)?
        .map(|w| RequestId {
            client: w.client,
            seq: w.seq,
            acked_below: w.acked_below,
        }))
}

pub fn to_metadata(id: &RequestId, md: &mut MetadataMap) {
    WireRequestId {
        client: id.client,
        seq: id.seq,
        acked_below: id.acked_below,
    }
    .write(md);
}

pub fn to_request_id(w: &WireRequestId) -> RequestId {
    RequestId {
        client: w.client,
        seq: w.seq,
        acked_below: w.acked_below,
    }
}

// The ensemble must never forget a result a client's request window still covers.
const _: () = assert!(
    coord_proto::metadata::REQUEST_WINDOW < coord_raft_store::state::MAX_RESULTS_PER_SESSION as u64
);

/// This replica acting as the client of requests that came without an id; a fresh random client
/// id per process, so sequence numbers may restart after a restart. Its requests may stay in
/// flight for as long as the tasks' calls park (30,000 GetAliveTasks calls of jaxlib's, each
/// waiting for the last): the session's lanes keep each client id within what the ensemble
/// remembers of it.
pub fn local_session() -> Arc<RequestSession> {
    RequestSession::new(rand::random::<u64>() | 1)
}

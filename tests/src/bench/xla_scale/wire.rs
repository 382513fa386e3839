//! A simulated task as jaxlib sets it up: its client of a shared connection, its XLA id and its
//! incarnations.

use std::sync::atomic::Ordering;

use coord_proto::conn::EagerEnd;
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient;
use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;

use super::super::tasks::ACCEPT_GZIP;

/// A connection's client as jaxlib sets its channel up: gzip both ways, no limit on an answer's
/// size. Over [`EagerEnd`], so that a request's one DATA frame ends the stream, as gRPC C++ sends
/// a unary call (tonic alone sends the end in a later frame, which the server waits for).
pub(super) type Client = CoordinationServiceClient<EagerEnd<Channel>>;

pub(super) fn client(ch: &EagerEnd<Channel>) -> Client {
    let c = CoordinationServiceClient::new(ch.clone()).max_decoding_message_size(usize::MAX);
    if ACCEPT_GZIP.load(Ordering::Relaxed) {
        c.send_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Gzip)
    } else {
        c
    }
}

/// Task `i`'s XLA id.
pub(super) fn id(i: usize) -> i32 {
    i32::try_from(i).unwrap_or(i32::MAX)
}

/// Task `i`'s incarnation (jaxlib draws a random one per process; any non-zero value will do).
pub(super) fn incarnation(i: usize) -> u64 {
    0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1)
}

/// What every request after RegisterTask carries: the task and the service it believes in.
pub(super) fn incarnations(i: usize, service: u64) -> Option<xla::Incarnations> {
    Some(xla::Incarnations {
        task_id: id(i),
        task_incarnation: incarnation(i),
        service_incarnation: service,
    })
}

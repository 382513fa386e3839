//! The size of an answer as it crossed the wire, for load generators whose answers are only
//! counted: a large job's answers are O(N²) bytes, and a generator that decompressed and decoded
//! them all would measure itself, not the leader.

use std::sync::atomic::{AtomicBool, Ordering};

use coord_proto::tensorflow as tf;

/// Whether the simulated tasks accept gzip answers, as TensorFlow's and jaxlib's gRPC clients do.
pub static ACCEPT_GZIP: AtomicBool = AtomicBool::new(true);

/// WaitForAllTasks on `ch`, keeping only the size of the answer as it crossed the wire
/// (compressed, if the task accepts gzip): the answers of a large job are O(N²) bytes, and a load
/// generator that decompressed and decoded them all would measure itself, not the leader. The
/// call is made on the channel directly, so tonic neither decompresses nor decodes the body.
pub(super) async fn answer_size(
    ch: coord_proto::conn::EagerEnd<tonic::transport::Channel>,
    req: tonic::Request<tf::WaitForAllTasksRequest>,
) -> Result<tonic::Response<usize>, tonic::Status> {
    call_size(ch, "/tensorflow.CoordinationService/WaitForAllTasks", req).await
}

/// A unary call of `path` on `ch`, keeping only the size of the answer as it crossed the wire
/// (see [`answer_size`]).
pub(super) async fn call_size<M: prost::Message>(
    mut ch: coord_proto::conn::EagerEnd<tonic::transport::Channel>,
    path: &'static str,
    req: tonic::Request<M>,
) -> Result<tonic::Response<usize>, tonic::Status> {
    use tonic::client::GrpcService;
    use tonic::codegen::http;
    let (metadata, _, message) = req.into_parts();
    let mut framed = Vec::with_capacity(5 + message.encoded_len());
    framed.push(0);
    framed.extend_from_slice(
        &u32::try_from(message.encoded_len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    message
        .encode(&mut framed)
        .map_err(|e| tonic::Status::internal(e.to_string()))?;
    let mut call = http::Request::post(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(
            bytes::Bytes::from(framed),
        )))
        .map_err(|e| tonic::Status::internal(e.to_string()))?;
    call.headers_mut().extend(metadata.into_headers());
    if ACCEPT_GZIP.load(Ordering::Relaxed) {
        call.headers_mut().insert(
            "grpc-accept-encoding",
            http::HeaderValue::from_static("gzip"),
        );
    }
    let unavailable = |e: &dyn std::fmt::Display| tonic::Status::unavailable(e.to_string());
    std::future::poll_fn(|cx| ch.poll_ready(cx))
        .await
        .map_err(|e| unavailable(&e))?;
    let answer = ch.call(call).await.map_err(|e| unavailable(&e))?;
    // A refusal comes trailers-only: grpc-status in the headers.
    if let Some(status) = tonic::Status::from_header_map(answer.headers()) {
        if status.code() != tonic::Code::Ok {
            return Err(status);
        }
    }
    let mut body = answer.into_body();
    let mut bytes = 0;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        let frame = frame?;
        if let Some(data) = frame.data_ref() {
            bytes += bytes::Buf::remaining(data);
        } else if let Some(status) = frame
            .trailers_ref()
            .and_then(tonic::Status::from_header_map)
        {
            if status.code() != tonic::Code::Ok {
                return Err(status);
            }
        }
    }
    Ok(tonic::Response::new(bytes))
}

//! The protobuf codec of every coord service: tonic's prost codec with small initial buffers.
//!
//! tonic starts each call's encode and decode buffers at 8 KiB. A coordinator holds thousands of
//! calls at once (every task's barrier wait, error poll, heartbeat), and messages are mostly tens of
//! bytes, so buffers start at 256 bytes and grow when a message needs more.
//!
//! [`UndecodedCodec`] is for a caller that only passes an answer on: it keeps the answer's bytes
//! ([`call_undecoded`] makes such a call).

use std::marker::PhantomData;

use bytes::{Buf, Bytes};
use tonic::codec::{BufferSettings, Codec, CompressionEncoding, DecodeBuf, Decoder};
use tonic::codegen::{Body, StdError};
use tonic_prost::ProstCodec;

const INITIAL_BUFFER: usize = 256;
/// Streaming encoders yield after this much data, as tonic's default.
const YIELD_THRESHOLD: usize = 32 * 1024;

#[derive(Debug, Clone, Copy)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(INITIAL_BUFFER, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(INITIAL_BUFFER, YIELD_THRESHOLD))
    }
}

/// Requests encoded as [`SmallBufferCodec`] encodes them; answers left as their message bytes,
/// undecoded. A proxy that hands one large answer (a whole job's devices) to several tasks keeps
/// it so, in one shared buffer, instead of decoding it into a tree it copies for each of them.
#[derive(Debug, Clone, Copy)]
pub struct UndecodedCodec<T>(PhantomData<T>);

impl<T> Default for UndecodedCodec<T> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T> Codec for UndecodedCodec<T>
where
    T: prost::Message + Send + 'static,
{
    type Encode = T;
    type Decode = Bytes;
    type Encoder = <ProstCodec<T, ()> as Codec>::Encoder;
    type Decoder = Undecoded;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, ()>::raw_encoder(BufferSettings::new(INITIAL_BUFFER, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        Undecoded
    }
}

/// An answer's message bytes, as they came (decompressed if they came compressed).
#[derive(Debug, Clone, Copy)]
pub struct Undecoded;

impl Decoder for Undecoded {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// Method `path` on `ch`, the answer's bytes kept undecoded ([`UndecodedCodec`]): what a proxy
/// (coord-proxy, or a follower relaying a call to the leader) uses to pass on an answer every
/// caller of a round shares. Messages are limited to `limit` bytes either way; `gzip` is offered
/// to the sender when the bytes travel a network worth saving (the answer then comes decompressed
/// once per call: a follower, whose link to the leader is fast, does not offer it).
pub async fn call_undecoded<C, Req>(
    ch: C,
    req: tonic::Request<Req>,
    path: &'static str,
    limit: usize,
    gzip: bool,
) -> Result<tonic::Response<Bytes>, tonic::Status>
where
    C: tonic::client::GrpcService<tonic::body::Body>,
    C::Error: Into<StdError>,
    C::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <C::ResponseBody as Body>::Error: Into<StdError> + Send,
    Req: prost::Message + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(ch)
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
    if gzip {
        grpc = grpc.accept_compressed(CompressionEncoding::Gzip);
    }
    grpc.ready().await.map_err(|e| {
        tonic::Status::unavailable(format!("the connection is not ready: {}", e.into()))
    })?;
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(req, path, UndecodedCodec::default()).await
}

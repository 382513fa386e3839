//! The direct link: `RecvTensor` over a plain framed TCP connection, beside gRPC on the same port.
//!
//! Over gRPC a 4 KiB receive crossed HTTP/2, hyper and tonic on both sides, with task hand-offs
//! on each (the client's channel buffer and connection tasks, the server's stream task): 4.5 and
//! 4.8 times the round trip of a raw TCP ping-pong of 4 KiB between two processes, in two runs of
//! `coord-bench rendezvous` on the project's machine. A direct link is a TCP connection that opens with
//! [`PREFACE`] and then carries one call and its answer at a time, read and written by the task
//! that makes the call and by one task per connection at the producer: nothing is handed over,
//! and a tensor's bytes go from the producer's buffer to the socket (one `writev` with its header)
//! and from the socket into the receiver's buffer, with no chunking and no re-framing.
//!
//! - A call: a frame of `u32` length (little-endian) and a prost-encoded `RecvTensorRequest`.
//! - Its answer: a frame of `u32` length, a kind byte and a body. [`TENSOR`]: a prost-encoded
//!   `TensorHeader`, then exactly `total_bytes` bytes of data, then [`END`], which shows that the
//!   stream is still in step (no more bytes than the header announced). [`ERROR`]: an `i32` gRPC
//!   code and the message.
//! - The link's port sorts its connections by their first bytes (`accept`): the preface, or a
//!   gRPC client's HTTP/2 preface, which it leaves to gRPC.
//! - The producer answers the preface with the preface before reading anything, so a connection
//!   whose first answer is something else went to a worker that serves gRPC only (it never read
//!   the call), and the call can go over gRPC instead.
//!
//! A call's connection belongs to its future: a receive given up (dropped) drops the connection
//! with it, so an answer never arrives for the wrong call, and the producer, which watches the
//! connection while it waits for the tensor, gives the tensor back. Idle connections are pooled by
//! [`super::links::Links`].

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use coord_proto::coord::link::{RecvTensorRequest, TensorHeader};
use prost::Message;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tonic::{Code, Status};

use super::buffers::BufferPool;
use super::wire::{check_header, header_of, MAX_PREALLOCATED};
use super::{Received, Tensor};

/// What a direct link's caller sends first, and the producer answers. As long as the Raft links'
/// prefaces, and unlike an HTTP/2 or TLS client's first bytes.
pub const PREFACE: &[u8] = b"coord-tlnk/1\n";
/// Answer kinds.
const TENSOR: u8 = 0;
const ERROR: u8 = 1;
/// Follows a tensor's data.
const END: &[u8] = b"tEND";
/// The largest frame either side reads (requests and headers are a few hundred bytes).
const MAX_FRAME: usize = 1 << 20;
/// Read buffer of a connection: a small tensor's answer arrives in one read.
const READ_BUFFER: usize = 64 << 10;
/// How long opening a connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller may take to send its first bytes.
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes a receiver reads at most before growing its buffer again (past [`MAX_PREALLOCATED`]).
const GROW_BY: usize = 64 << 20;

/// Why a direct call failed.
#[derive(Debug)]
pub enum CallError {
    /// The peer does not speak the direct link (it never read the call): use gRPC.
    NotSpoken,
    /// The connection failed: the peer is gone or broke it. The call may have been served.
    Io(io::Error),
    /// The peer answered with an error; the connection can carry another call.
    Status(Status),
    /// The peer answered with something malformed; the connection is out of step.
    Malformed(Status),
}

impl From<io::Error> for CallError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// A direct connection to a peer, on the caller's side.
pub struct Conn {
    stream: BufReader<TcpStream>,
    /// Whether the peer's answer to the preface is still to be read (a new connection).
    fresh: bool,
}

impl Conn {
    /// Opens a connection to `address`. The preface goes out with the first call.
    pub async fn connect(address: &str) -> io::Result<Self> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        tcp.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::with_capacity(READ_BUFFER, tcp),
            fresh: true,
        })
    }

    /// Receives the tensor `request` names. On `Ok` the connection is ready for another call.
    /// A large tensor is received into a buffer of `buffers`.
    pub async fn call(
        &mut self,
        request: &RecvTensorRequest,
        buffers: &Arc<BufferPool>,
    ) -> Result<Received, CallError> {
        let mut out = Vec::with_capacity(PREFACE.len() + 4 + request.encoded_len());
        if self.fresh {
            out.extend_from_slice(PREFACE);
        }
        put_frame(&mut out, request);
        self.stream.get_mut().write_all(&out).await?;
        if self.fresh {
            self.read_preface().await?;
            self.fresh = false;
        }
        let (kind, body) = read_frame(&mut self.stream, true)
            .await?
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        match kind {
            TENSOR => self.read_tensor(&body, buffers).await,
            ERROR => Err(decode_error(&body)),
            other => Err(CallError::Malformed(Status::data_loss(format!(
                "an answer of unknown kind {other}"
            )))),
        }
    }

    /// The peer's answer to the preface: the preface itself from a producer that speaks the
    /// direct link; anything else (an HTTP/2 server's settings, a closed connection) from one
    /// that does not.
    async fn read_preface(&mut self) -> Result<(), CallError> {
        let mut answer = [0u8; PREFACE.len()];
        match self.stream.read_exact(&mut answer).await {
            Ok(_) if answer == PREFACE => Ok(()),
            Ok(_) => Err(CallError::NotSpoken),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(CallError::NotSpoken),
            Err(e) => Err(CallError::Io(e)),
        }
    }

    /// The data a [`TENSOR`] answer announces, and the [`END`] after it.
    async fn read_tensor(
        &mut self,
        body: &[u8],
        buffers: &Arc<BufferPool>,
    ) -> Result<Received, CallError> {
        let header = TensorHeader::decode(body).map_err(|e| {
            CallError::Malformed(Status::data_loss(format!("an undecodable header: {e}")))
        })?;
        let (dtype, total) = check_header(&header).map_err(CallError::Malformed)?;
        let mut data = buffers
            .take(usize::try_from(total).map_or(MAX_PREALLOCATED, |t| t.min(MAX_PREALLOCATED)));
        read_data(&mut self.stream, &mut data, total).await?;
        let mut end = [0u8; END.len()];
        self.stream.read_exact(&mut end).await?;
        if end != END {
            return Err(CallError::Malformed(Status::data_loss(
                "more bytes than the header announced",
            )));
        }
        let data = BufferPool::freeze(buffers, data);
        let tensor = Tensor::new(dtype, header.shape, data)
            .map_err(|e| CallError::Malformed(Status::data_loss(e)))?;
        Ok(Received {
            tensor,
            is_dead: header.is_dead,
        })
    }
}

/// `total` bytes off `stream`, into `data`, which the header sized only up to a bound (a lying
/// header cannot make this worker allocate gigabytes up front) and which grows as bytes arrive.
/// Once the connection's buffer is drained, reads go straight into the tensor's buffer.
async fn read_data(
    stream: &mut BufReader<TcpStream>,
    data: &mut Vec<u8>,
    total: u64,
) -> io::Result<()> {
    let total = usize::try_from(total)
        .map_err(|_| io::Error::other(format!("a tensor of {total} bytes")))?;
    while data.len() < total {
        let want = (total - data.len()).min(GROW_BY);
        data.reserve(want);
        if stream.read_buf(&mut (&mut *data).limit(want)).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Appends `message` as a frame: its length, then itself.
fn put_frame(out: &mut Vec<u8>, message: &impl Message) {
    out.put_u32_le(message.encoded_len() as u32);
    // Encoding into a Vec grows it as needed; it cannot fail.
    let _ = message.encode(out);
}

/// Reads a frame: its kind byte if `kinded` (answers have one, calls do not; theirs reads 0) and
/// its body; `Ok(None)` when the peer closed the connection between frames.
async fn read_frame(
    stream: &mut BufReader<impl tokio::io::AsyncRead + Unpin>,
    kinded: bool,
) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut len = [0u8; 4];
    match stream.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::other(format!(
            "a frame of {len} bytes, over the limit of {MAX_FRAME}"
        )));
    }
    let kind = if kinded { stream.read_u8().await? } else { 0 };
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    Ok(Some((kind, body)))
}

/// The `i32` code and the message of an [`ERROR`] answer.
fn decode_error(body: &[u8]) -> CallError {
    let Some((code, message)) = body.split_first_chunk::<4>() else {
        return CallError::Malformed(Status::data_loss("a truncated error answer"));
    };
    CallError::Status(Status::new(
        Code::from_i32(i32::from_le_bytes(*code)),
        String::from_utf8_lossy(message),
    ))
}

/// The producer's side of a call: what a direct link's port serves. The link service implements
/// it (`super::link`) with the handler that answers gRPC's calls too; the direct link knows only
/// this, so that it stays below the service.
pub(super) trait Producer: Clone + Send + Sync + 'static {
    /// The tensor `request` asks for, once sent.
    fn take(
        &self,
        request: RecvTensorRequest,
    ) -> impl Future<Output = Result<Received, Status>> + Send;
}

/// Serves the direct link on `tcp`, whose preface was read: answers it, then each call in turn
/// as `link` answers gRPC's, until the caller closes the connection.
async fn serve_connection(mut tcp: TcpStream, link: &impl Producer) -> io::Result<()> {
    tcp.write_all(PREFACE).await?;
    let (reader, mut writer) = tcp.split();
    let mut reader = BufReader::with_capacity(READ_BUFFER, reader);
    while let Some((_, body)) = read_frame(&mut reader, false).await? {
        let request = match RecvTensorRequest::decode(body.as_slice()) {
            Ok(r) => r,
            Err(e) => {
                let status = Status::invalid_argument(format!("an undecodable call: {e}"));
                write_error(&mut writer, &status).await?;
                continue;
            }
        };
        // The tensor, unless the caller goes away first (a dropped receive): then the tensor is
        // given back, as when a gRPC call is cancelled. A caller sends nothing while it waits, so
        // anything readable now is the end of the connection.
        let answer = tokio::select! {
            biased;
            answer = link.take(request) => answer,
            _ = reader.fill_buf() => return Ok(()),
        };
        match answer {
            Ok(received) => write_tensor(&mut writer, received).await?,
            Err(status) => write_error(&mut writer, &status).await?,
        }
    }
    Ok(())
}

/// Accepts connections on `listener` until `grpc` closes, and sorts each in a task of its own (a
/// slow caller holds up nobody): the direct link's are served there, the others go to gRPC
/// through `grpc`.
pub(super) async fn accept(
    listener: TcpListener,
    link: impl Producer,
    grpc: mpsc::Sender<io::Result<TcpStream>>,
) {
    loop {
        let accepted = tokio::select! {
            // The gRPC server is gone (it failed, or its future was dropped): so is the link.
            () = grpc.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors and the like: wait a little, do not spin.
                tracing::warn!(error = %e, "link: cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let (link, grpc) = (link.clone(), grpc.clone());
        tokio::spawn(async move {
            let mut tcp = tcp;
            match tokio::time::timeout(FIRST_BYTES_TIMEOUT, is_direct(&mut tcp)).await {
                Ok(Ok(true)) => {
                    if let Err(e) = serve_connection(tcp, &link).await {
                        tracing::debug!(error = %e, "link: a direct connection failed");
                    }
                }
                Ok(Ok(false)) => {
                    let _ = grpc.send(Ok(tcp)).await;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "link: closed before its first bytes"),
                Err(_) => tracing::debug!("link: no bytes within {FIRST_BYTES_TIMEOUT:?}"),
            }
        });
    }
}

/// Whether `tcp` begins with the direct link's preface, which is then consumed. A gRPC client
/// speaks first too (the HTTP/2 preface), and its first byte differs, so its connection is told
/// apart at once and left untouched.
async fn is_direct(tcp: &mut TcpStream) -> io::Result<bool> {
    let mut head = [0u8; PREFACE.len()];
    loop {
        let n = tcp.peek(&mut head).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if head[..n] != PREFACE[..n] {
            return Ok(false);
        }
        if n == head.len() {
            tcp.read_exact(&mut head).await?;
            return Ok(true);
        }
        // Part of the preface has arrived (it is sent in one write, so this is rare): peeking
        // again at once would return the same bytes, so wait a little for the rest.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A [`TENSOR`] answer in one vectored write: header, the producer's own buffer, [`END`].
async fn write_tensor(w: &mut (impl AsyncWrite + Unpin), received: Received) -> io::Result<()> {
    let header = header_of(&received);
    let data = received.tensor.data().clone();
    let mut head = Vec::with_capacity(5 + header.encoded_len());
    head.put_u32_le(header.encoded_len() as u32);
    head.put_u8(TENSOR);
    let _ = header.encode(&mut head);
    let mut answer = Bytes::from(head).chain(data).chain(Bytes::from_static(END));
    w.write_all_buf(&mut answer).await
}

/// An [`ERROR`] answer. A message is cut to fit a frame.
async fn write_error(w: &mut (impl AsyncWrite + Unpin), status: &Status) -> io::Result<()> {
    let message = status.message().as_bytes();
    let message = &message[..message.len().min(MAX_FRAME - 4)];
    let mut out = Vec::with_capacity(9 + message.len());
    out.put_u32_le((4 + message.len()) as u32);
    out.put_u8(ERROR);
    out.put_i32_le(status.code() as i32);
    out.extend_from_slice(message);
    w.write_all(&out).await
}

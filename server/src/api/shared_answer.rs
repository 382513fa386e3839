//! Answers that every task of a job gets alike, sent from one shared buffer.
//!
//! WaitForAllTasks answers each of a job's N tasks with the whole job's devices. tonic encodes each
//! answer into a buffer of its own and holds it until the client has read it, so N answers of N
//! devices are N² bytes of memory at once (10,000 tasks with one 170-byte device each: 22 GB). A
//! handler instead attaches the answer, encoded once for the whole job, as a [`SharedAnswer`]
//! extension of its response; [`RewriteLayer`](crate::api::rewrite::RewriteLayer) then sends
//! those bytes as the body by reference, one buffer for every caller, and gzip-compressed (also
//! once) to a caller that accepts gzip, as TensorFlow's and jaxlib's gRPC clients do. Every other
//! response passes untouched.

use std::collections::VecDeque;
use std::io::Write;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes};
use http_body::Frame;
use tonic::body::Body;
use tonic::codegen::http::{HeaderMap, HeaderValue, Response};

/// A whole answer message, encoded once with its gRPC frame prefix; its gzip form made on first
/// use. The prefix and the message are one buffer, so each answer leaves as one run of full-sized
/// DATA frames: a separate 5-byte frame ahead of every answer counts against the receiver's
/// budget for small frames (h2 0.4.20 ends a connection that buffers too many with
/// ENHANCE_YOUR_CALM; a 30,000-task job met it).
#[derive(Debug)]
pub struct AnswerBytes {
    plain: Bytes,
    gzip: OnceLock<Option<Bytes>>,
}

/// A gRPC message's frame prefix: the compressed flag and the message's length.
const PREFIX: usize = 5;

/// The shortest message worth compressing. Each compression builds a deflate compressor
/// (flate2's Rust backend allocates and zeroes about 300 KB of tables for it: about 5 µs, and the
/// caches it evicts) to save at most the message's length less gzip's 18 bytes of header and
/// trailer. A job's releases answer every parked call of a barrier at once, each with an answer
/// of a few bytes (a Barrier's counter, a heartbeat's incarnation) that gzip never shortens: at
/// 10,000 tasks accepting gzip, compressing each of them took the release from 65 to 150 ms.
const GZIP_FROM: usize = 128;

/// Answers gzip-compressed by this process, their bytes before compression, and the bytes of
/// those sent compressed after it: what `/metrics` reports as `coord_answer_compressions_total`,
/// `coord_answer_compressed_bytes_total` and `coord_answer_gzipped_bytes_total`. A shared answer
/// counts once however many callers get it; an answer that grows with the job and counts once
/// per caller is one not shared.
static COMPRESSIONS: AtomicU64 = AtomicU64::new(0);
static COMPRESSED_BYTES: AtomicU64 = AtomicU64::new(0);
static GZIPPED_BYTES: AtomicU64 = AtomicU64::new(0);

/// What this process compressed so far (see [`COMPRESSIONS`]).
#[derive(Clone, Copy, Debug)]
pub struct Compressed {
    pub answers: u64,
    /// Their bytes before compression.
    pub bytes_in: u64,
    /// The bytes of those sent compressed (gzip shortened them), after compression.
    pub bytes_out: u64,
}

/// The answers compressed so far (see [`COMPRESSIONS`]).
pub fn compressed() -> Compressed {
    Compressed {
        answers: COMPRESSIONS.load(Relaxed),
        bytes_in: COMPRESSED_BYTES.load(Relaxed),
        bytes_out: GZIPPED_BYTES.load(Relaxed),
    }
}

/// `len` bytes of a message (compressed or not) framed: the prefix, then room for the message.
fn framed(compressed: bool, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(PREFIX + len);
    out.put_u8(u8::from(compressed));
    out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
    out
}

impl AnswerBytes {
    /// `message`, encoded once.
    pub fn encode(message: &impl prost::Message) -> Self {
        let len = message.encoded_len();
        let mut out = framed(false, len);
        message.encode_raw(&mut out);
        Self {
            plain: out.into(),
            gzip: OnceLock::new(),
        }
    }

    /// An already encoded message (one relayed from the leader, as it came).
    pub fn raw(message: &[u8]) -> Self {
        let mut out = framed(false, message.len());
        out.extend_from_slice(message);
        Self {
            plain: out.into(),
            gzip: OnceLock::new(),
        }
    }

    /// The message, without its frame prefix.
    pub fn message(&self) -> &[u8] {
        &self.plain[PREFIX..]
    }

    /// The body of an answer of this message: gzip-compressed if `gzip` (the caller accepts it)
    /// and that saves bytes; whether it is compressed.
    pub fn frames(&self, gzip: bool) -> (Frames, bool) {
        // Compressed only for a caller that accepts it: made on first use.
        let compressed = if gzip { self.gzip() } else { None };
        match compressed {
            Some(z) => (frames(z), true),
            None => (frames(&self.plain), false),
        }
    }

    /// The message gzip-compressed and framed (None if it is shorter than [`GZIP_FROM`], or if
    /// compressing failed or saved nothing: it is then sent plain).
    fn gzip(&self) -> Option<&Bytes> {
        self.gzip
            .get_or_init(|| {
                let message = self.plain.get(PREFIX..)?;
                if message.len() < GZIP_FROM {
                    return None;
                }
                COMPRESSIONS.fetch_add(1, Relaxed);
                COMPRESSED_BYTES.fetch_add(message.len() as u64, Relaxed);
                let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                z.write_all(message).ok()?;
                let z = z.finish().ok()?;
                if z.len() >= message.len() {
                    return None;
                }
                GZIPPED_BYTES.fetch_add(z.len() as u64, Relaxed);
                let mut out = framed(true, z.len());
                out.extend_from_slice(&z);
                Some(Bytes::from(out))
            })
            .as_ref()
    }
}

/// The encodings of the last few answers that are one value of the state shared by every caller
/// (an `Arc`), known by that pointer: each kept answer holds its `Arc`, so a compared pointer is
/// never one reused for another answer.
pub struct Encodings<T> {
    kept: std::sync::Mutex<VecDeque<(Arc<T>, Arc<AnswerBytes>)>>,
}

/// Answers [`Encodings`] keeps: the few a job waits for at about the same time.
const ENCODINGS_KEPT: usize = 4;

impl<T> Default for Encodings<T> {
    fn default() -> Self {
        Self {
            kept: Default::default(),
        }
    }
}

impl<T> Encodings<T> {
    /// `answer`'s encoding: made with `encode` by its first caller, shared by the others.
    pub fn of(&self, answer: &Arc<T>, encode: impl FnOnce(&T) -> AnswerBytes) -> Arc<AnswerBytes> {
        let (_, bytes) = kept_or_made(
            &self.kept,
            |(a, _)| Arc::ptr_eq(a, answer),
            || (answer.clone(), Arc::new(encode(answer))),
        );
        bytes
    }
}

/// The kept entry `found` picks, else one `made` and kept in place of the oldest past
/// [`ENCODINGS_KEPT`]: how [`Encodings`] and [`Relayed`] keep the few answers a job waits for at
/// about the same time.
fn kept_or_made<K: Clone>(
    kept: &std::sync::Mutex<VecDeque<K>>,
    found: impl Fn(&K) -> bool,
    made: impl FnOnce() -> K,
) -> K {
    let mut kept = kept
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(k) = kept.iter().find(|k| found(k)) {
        return k.clone();
    }
    let k = made();
    if kept.len() >= ENCODINGS_KEPT {
        kept.pop_front();
    }
    kept.push_back(k.clone());
    k
}

/// The last few answers a follower relayed from the leader, known by their bytes.
///
/// The leader answers every caller of a round from one encoding, and a follower relaying the
/// round's calls gets those bytes once per call. Decoded and encoded again for each caller, as
/// tonic would, a round of N tasks through a follower cost N decodes and N encodes of N tasks'
/// answer, each held until its caller read it (and none gzipped). Kept undecoded instead
/// (`coord_proto::codec::call_undecoded`), an answer equal to a kept one is sent from that one's
/// buffer, gzipped once; equal bytes are the same answer. Each is kept with the bytes it was
/// made from, so that callers handed the same buffer (the callers of a round waiting on the
/// leader with one call, see `api::relayed_waits`) find it by address, not by comparing a
/// whole job's answer once per caller.
#[derive(Default)]
pub struct Relayed {
    kept: std::sync::Mutex<VecDeque<(Bytes, Arc<AnswerBytes>)>>,
}

/// Relayed answers shorter than this are framed for their caller alone: comparing them with the
/// kept ones would save nothing, and keeping them would push out the large answers worth sharing.
const RELAYED_KEPT_FROM: usize = 1024;

impl Relayed {
    /// `message`'s encoding: the kept one with these bytes, else one made (and kept, if long).
    pub fn of(&self, message: &Bytes) -> Arc<AnswerBytes> {
        if message.len() < RELAYED_KEPT_FROM {
            return Arc::new(AnswerBytes::raw(message));
        }
        let same = |from: &Bytes| from.as_ptr() == message.as_ptr() && from.len() == message.len();
        let found = |(from, a): &(Bytes, Arc<AnswerBytes>)| same(from) || a.message() == message;
        let made = || (message.clone(), Arc::new(AnswerBytes::raw(message)));
        kept_or_made(&self.kept, found, made).1
    }
}

/// The extension a handler attaches: send this instead of the response's own message.
#[derive(Clone, Debug)]
pub struct SharedAnswer(pub Arc<AnswerBytes>);

/// Whether the caller's `grpc-accept-encoding` lists gzip.
pub fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-accept-encoding")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|e| e.trim() == "gzip"))
}

/// The framed message (compressed or not), then the OK trailers.
fn frames(framed: &Bytes) -> Frames {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    Frames::of([Frame::data(framed.clone()), Frame::trailers(trailers)])
}

/// A body that yields its frames, then ends.
pub struct Frames(VecDeque<Frame<Bytes>>);

impl Frames {
    pub fn of<const N: usize>(frames: [Frame<Bytes>; N]) -> Self {
        Self(VecDeque::from(frames))
    }
}

impl http_body::Body for Frames {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        Poll::Ready(self.get_mut().0.pop_front().map(Ok))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }
}

/// `response` with its body replaced by the shared answer it carries, if any.
pub fn shared(mut response: Response<Body>, gzip: bool) -> Response<Body> {
    let Some(SharedAnswer(answer)) = response.extensions_mut().remove::<SharedAnswer>() else {
        return response;
    };
    answered(response, &answer, gzip)
}

/// `response` with `answer` as its body: gzipped if `gzip` (the caller accepts it) and that
/// saves bytes, the header saying so.
pub fn answered(mut response: Response<Body>, answer: &AnswerBytes, gzip: bool) -> Response<Body> {
    let (body, compressed) = answer.frames(gzip);
    if compressed {
        response
            .headers_mut()
            .insert("grpc-encoding", HeaderValue::from_static("gzip"));
    }
    *response.body_mut() = Body::new(body);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::io::Read;

    async fn sent(response: Response<Body>) -> (HeaderMap, Vec<u8>, Option<HeaderMap>) {
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.expect("body");
        let trailers = collected.trailers().cloned();
        (parts.headers, collected.to_bytes().to_vec(), trailers)
    }

    /// A message gzip shortens: a string field of 160 bytes.
    const LONG: &[u8] = b"\x0a\xa0\x01\
        aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\
        aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    /// A message gzip would shorten but not by enough to be worth it: a string field of 64 bytes.
    const SHORT: &[u8] =
        b"\x0a\x40aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    fn with_answer(message: &'static [u8]) -> Response<Body> {
        let mut r = Response::new(Body::empty());
        r.extensions_mut()
            .insert(SharedAnswer(Arc::new(AnswerBytes::raw(message))));
        r
    }

    #[tokio::test]
    async fn the_shared_answer_is_the_body_plain_or_gzipped() {
        let (headers, body, trailers) = sent(shared(with_answer(b"\x09abcdefgh"), false)).await;
        assert_eq!(body, b"\x00\x00\x00\x00\x09\x09abcdefgh");
        assert!(headers.get("grpc-encoding").is_none());
        assert_eq!(
            trailers.and_then(|t| t.get("grpc-status").cloned()),
            Some(HeaderValue::from_static("0"))
        );

        // Too short to gain from gzip, or to gain enough: sent plain to a caller that accepts
        // it, too.
        let (headers, body, _) = sent(shared(with_answer(b"\x09abcdefgh"), true)).await;
        assert_eq!(body, b"\x00\x00\x00\x00\x09\x09abcdefgh");
        assert!(headers.get("grpc-encoding").is_none());
        let (headers, body, _) = sent(shared(with_answer(SHORT), true)).await;
        assert_eq!((body[0], &body[5..]), (0, SHORT), "sent plain");
        assert!(headers.get("grpc-encoding").is_none());

        let (headers, body, _) = sent(shared(with_answer(LONG), true)).await;
        assert_eq!(
            headers.get("grpc-encoding").map(|v| v.as_bytes()),
            Some(&b"gzip"[..])
        );
        assert!(body.len() < LONG.len(), "{} bytes", body.len());
        assert_eq!(body[0], 1, "compressed flag");
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        assert_eq!(len, body.len() - 5);
        let mut plain = Vec::new();
        flate2::read::GzDecoder::new(&body[5..])
            .read_to_end(&mut plain)
            .expect("gunzip");
        assert_eq!(plain, LONG);
    }

    #[tokio::test]
    async fn each_answer_is_one_data_frame_then_the_trailers() {
        for gzip in [false, true] {
            let mut body = shared(with_answer(LONG), gzip).into_body();
            let first = body.frame().await.expect("a frame").expect("data");
            assert!(first.is_data(), "prefix and message in one frame");
            let second = body.frame().await.expect("a frame").expect("trailers");
            assert!(second.is_trailers());
            assert!(body.frame().await.is_none());
        }
    }

    #[tokio::test]
    async fn other_responses_pass_untouched() {
        let r = Response::new(Body::empty());
        let (headers, body, _) = sent(shared(r, true)).await;
        assert!(body.is_empty() && headers.is_empty());
    }

    #[test]
    fn gzip_is_taken_only_when_listed() {
        let mut h = HeaderMap::new();
        assert!(!accepts_gzip(&h));
        h.insert(
            "grpc-accept-encoding",
            HeaderValue::from_static("identity, deflate, gzip"),
        );
        assert!(accepts_gzip(&h));
        h.insert(
            "grpc-accept-encoding",
            HeaderValue::from_static("identity,gzipx"),
        );
        assert!(!accepts_gzip(&h));
    }

    /// Relayed answers with equal bytes are sent from one buffer; other bytes get their own; short
    /// ones are framed for their caller alone and never kept.
    #[test]
    fn relayed_answers_share_a_buffer_by_their_bytes() {
        let relayed = Relayed::default();
        let long = |fill: u8| Bytes::from(vec![fill; RELAYED_KEPT_FROM]);
        let first = relayed.of(&long(1));
        let again = relayed.of(&long(1));
        assert!(Arc::ptr_eq(&first, &again), "equal bytes, one buffer");
        assert_eq!(first.message(), &long(1)[..]);
        let other = relayed.of(&long(2));
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(other.message(), &long(2)[..]);
        // Past the kept few, the oldest goes.
        for fill in 3..3 + ENCODINGS_KEPT as u8 {
            relayed.of(&long(fill));
        }
        assert!(!Arc::ptr_eq(&first, &relayed.of(&long(1))), "pushed out");

        // The same buffer handed to several callers is found by its address.
        let shared = long(9);
        let by_address = relayed.of(&shared);
        assert!(Arc::ptr_eq(&by_address, &relayed.of(&shared.clone())));

        let short = Bytes::from_static(SHORT);
        let (a, b) = (relayed.of(&short), relayed.of(&short));
        assert!(!Arc::ptr_eq(&a, &b), "short answers are not kept");
        assert_eq!((a.message(), b.message()), (SHORT, SHORT));
    }
}

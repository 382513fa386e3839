//! torch's TCPStore frames, byte for byte as torch 2.15's client sends them and its libuv server
//! answers (`torch/csrc/distributed/c10d/store/TCPStoreBackend.hpp` in the wheel).
//!
//! A request is one query-type byte and its arguments. Integers travel raw in the host's order
//! (little-endian on every platform torch ships for); a key or a value is a u64 length and its
//! bytes. Nothing frames a request as a whole, so a request is read field by field, and each
//! length is checked against torch's own limits before anything is allocated: a key over 8 KiB, a
//! value over 8 MiB or more than 128 Ki keys is refused as the libuv server refuses it, and the
//! connection is closed. A stream that ends inside a request is a truncated frame.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The first message of every connection carries this number (`validationMagicNumber`).
pub const MAGIC: u32 = 0x3C85_F7CE;
/// torch's libuv server: `MAX_STRING_LEN`, `MAX_PAYLOAD_LEN`, `MAX_KEY_COUNT`.
pub const MAX_KEY_BYTES: u64 = 8 << 10;
pub const MAX_VALUE_BYTES: u64 = 8 << 20;
pub const MAX_KEYS: u64 = 128 << 10;

/// `CheckResponseType`.
pub const READY: u8 = 0;
pub const NOT_READY: u8 = 1;
/// `WaitResponseType`.
pub const STOP_WAITING: u8 = 0;
pub const WAIT_CANCELED: u8 = 1;

/// `QueryType`'s numbers.
pub mod query {
    pub const VALIDATE: u8 = 0;
    pub const SET: u8 = 1;
    pub const COMPARE_SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const ADD: u8 = 4;
    pub const CHECK: u8 = 5;
    pub const WAIT: u8 = 6;
    pub const GETNUMKEYS: u8 = 7;
    pub const DELETE_KEY: u8 = 8;
    pub const APPEND: u8 = 9;
    pub const MULTI_GET: u8 = 10;
    pub const MULTI_SET: u8 = 11;
    pub const CANCEL_WAIT: u8 = 12;
    pub const PING: u8 = 13;
    pub const QUEUE_PUSH: u8 = 14;
    pub const QUEUE_POP: u8 = 15;
    pub const QUEUE_LEN: u8 = 16;
    pub const LIST_KEYS: u8 = 17;
    pub const BARRIER: u8 = 18;
}

/// One request of a torch client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Validate(u32),
    Set(Bytes, Bytes),
    CompareSet {
        key: Bytes,
        expected: Bytes,
        desired: Bytes,
    },
    Get(Bytes),
    Add(Bytes, i64),
    Check(Vec<Bytes>),
    Wait(Vec<Bytes>),
    GetNumKeys,
    DeleteKey(Bytes),
    Append(Bytes, Bytes),
    MultiGet(Vec<Bytes>),
    MultiSet(Vec<(Bytes, Bytes)>),
    CancelWait,
    Ping(u32),
    QueuePush(Bytes, Bytes),
    QueuePop(Bytes),
    QueueLen(Bytes),
    ListKeys,
    Barrier(Bytes, i64),
}

/// Why a connection's input is refused; the connection is closed with this in the log.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("unknown query type {0}")]
    UnknownQuery(u8),
    #[error("a key of {0} bytes, over torch's limit of {MAX_KEY_BYTES}")]
    KeyTooLong(u64),
    #[error("a value of {0} bytes, over torch's limit of {MAX_VALUE_BYTES}")]
    ValueTooLong(u64),
    #[error("{0} keys in one request, over torch's limit of {MAX_KEYS}")]
    TooManyKeys(u64),
    #[error("a truncated frame: the connection ended inside a request of query type {0}")]
    Truncated(u8),
    #[error("reading the socket failed: {0}")]
    Io(std::io::Error),
}

/// Reads the arguments of a request whose query-type byte `op` was just read.
pub async fn read_request<R: AsyncRead + Unpin>(op: u8, r: &mut R) -> Result<Request, FrameError> {
    let mut f = Fields { r, op };
    use query::*;
    Ok(match op {
        VALIDATE => Request::Validate(f.u32().await?),
        SET => Request::Set(f.key().await?, f.value().await?),
        COMPARE_SET => Request::CompareSet {
            key: f.key().await?,
            expected: f.value().await?,
            desired: f.value().await?,
        },
        GET => Request::Get(f.key().await?),
        ADD => Request::Add(f.key().await?, f.i64().await?),
        CHECK => Request::Check(f.keys().await?),
        WAIT => Request::Wait(f.keys().await?),
        GETNUMKEYS => Request::GetNumKeys,
        DELETE_KEY => Request::DeleteKey(f.key().await?),
        APPEND => Request::Append(f.key().await?, f.value().await?),
        MULTI_GET => Request::MultiGet(f.keys().await?),
        MULTI_SET => {
            let n = f.count().await?;
            let mut pairs = Vec::with_capacity(n.min(1024) as usize);
            for _ in 0..n {
                pairs.push((f.key().await?, f.value().await?));
            }
            Request::MultiSet(pairs)
        }
        CANCEL_WAIT => Request::CancelWait,
        PING => Request::Ping(f.u32().await?),
        QUEUE_PUSH => Request::QueuePush(f.key().await?, f.value().await?),
        QUEUE_POP => Request::QueuePop(f.key().await?),
        QUEUE_LEN => Request::QueueLen(f.key().await?),
        LIST_KEYS => Request::ListKeys,
        BARRIER => Request::Barrier(f.key().await?, f.i64().await?),
        other => return Err(FrameError::UnknownQuery(other)),
    })
}

/// The fields of one request, read in turn.
struct Fields<'a, R> {
    r: &'a mut R,
    op: u8,
}

impl<R: AsyncRead + Unpin> Fields<'_, R> {
    fn err(&self, e: std::io::Error) -> FrameError {
        match e.kind() {
            std::io::ErrorKind::UnexpectedEof => FrameError::Truncated(self.op),
            _ => FrameError::Io(e),
        }
    }

    async fn u32(&mut self) -> Result<u32, FrameError> {
        let r = self.r.read_u32_le().await;
        r.map_err(|e| self.err(e))
    }

    async fn u64(&mut self) -> Result<u64, FrameError> {
        let r = self.r.read_u64_le().await;
        r.map_err(|e| self.err(e))
    }

    async fn i64(&mut self) -> Result<i64, FrameError> {
        let r = self.r.read_i64_le().await;
        r.map_err(|e| self.err(e))
    }

    async fn bytes(&mut self, len: u64) -> Result<Bytes, FrameError> {
        let mut buf = vec![0u8; len as usize];
        let r = self.r.read_exact(&mut buf).await;
        r.map_err(|e| self.err(e))?;
        Ok(Bytes::from(buf))
    }

    async fn key(&mut self) -> Result<Bytes, FrameError> {
        let len = self.u64().await?;
        if len > MAX_KEY_BYTES {
            return Err(FrameError::KeyTooLong(len));
        }
        self.bytes(len).await
    }

    async fn value(&mut self) -> Result<Bytes, FrameError> {
        let len = self.u64().await?;
        if len > MAX_VALUE_BYTES {
            return Err(FrameError::ValueTooLong(len));
        }
        self.bytes(len).await
    }

    async fn count(&mut self) -> Result<u64, FrameError> {
        let n = self.u64().await?;
        if n > MAX_KEYS {
            return Err(FrameError::TooManyKeys(n));
        }
        Ok(n)
    }

    async fn keys(&mut self) -> Result<Vec<Bytes>, FrameError> {
        let n = self.count().await?;
        let mut keys = Vec::with_capacity(n.min(1024) as usize);
        for _ in 0..n {
            keys.push(self.key().await?);
        }
        Ok(keys)
    }
}

/// An answer being written: the fields torch's client reads, in its encoding.
#[derive(Default)]
pub struct Reply(pub Vec<u8>);

impl Reply {
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }

    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A length-prefixed byte string (a value or a key).
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(&(v.len() as u64).to_le_bytes());
        self.0.extend_from_slice(v);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(frame: &[u8]) -> Result<Request, FrameError> {
        let mut r = frame;
        let op = r.read_u8().await.map_err(FrameError::Io)?;
        read_request(op, &mut r).await
    }

    #[tokio::test]
    async fn reads_what_torch_sends() {
        // SET("ab", "xyz") as captured from torch's client (it prefixes keys with '/').
        let set = b"\x01\x03\x00\x00\x00\x00\x00\x00\x00/ab\x03\x00\x00\x00\x00\x00\x00\x00xyz";
        assert_eq!(
            parse(set).await.expect("set"),
            Request::Set(Bytes::from_static(b"/ab"), Bytes::from_static(b"xyz"))
        );
        // The handshake: VALIDATE(magic), then PING(pid), in one segment.
        let mut hello: &[u8] = b"\x00\xce\xf7\x85\x3c\x0d\x39\x05\x00\x00";
        let op = hello.read_u8().await.expect("op");
        let v = read_request(op, &mut hello).await.expect("validate");
        assert_eq!(v, Request::Validate(MAGIC));
        let op = hello.read_u8().await.expect("op");
        assert_eq!(
            read_request(op, &mut hello).await.expect("ping"),
            Request::Ping(1337)
        );
        let add = [
            &[4u8][..],
            &1u64.to_le_bytes(),
            b"n",
            &(-3i64).to_le_bytes(),
        ]
        .concat();
        assert_eq!(
            parse(&add).await.expect("add"),
            Request::Add(Bytes::from_static(b"n"), -3)
        );
    }

    #[tokio::test]
    async fn refuses_what_torch_refuses() {
        let long_key = [&[3u8][..], &(MAX_KEY_BYTES + 1).to_le_bytes()].concat();
        assert!(matches!(
            parse(&long_key).await,
            Err(FrameError::KeyTooLong(n)) if n == MAX_KEY_BYTES + 1
        ));
        let big = [
            &[1u8][..],
            &1u64.to_le_bytes(),
            b"k",
            &(MAX_VALUE_BYTES + 1).to_le_bytes(),
        ]
        .concat();
        assert!(matches!(
            parse(&big).await,
            Err(FrameError::ValueTooLong(_))
        ));
        let many = [&[6u8][..], &(MAX_KEYS + 1).to_le_bytes()].concat();
        assert!(matches!(
            parse(&many).await,
            Err(FrameError::TooManyKeys(_))
        ));
        assert!(matches!(
            parse(&[99]).await,
            Err(FrameError::UnknownQuery(99))
        ));
        let cut = [&[1u8][..], &5u64.to_le_bytes(), b"ab"].concat();
        assert!(matches!(parse(&cut).await, Err(FrameError::Truncated(1))));
    }

    #[test]
    fn replies_are_torchs_encoding() {
        let r = Reply::default().i64(2).bytes(b"/a").u8(STOP_WAITING);
        assert_eq!(
            r.0,
            [&2i64.to_le_bytes()[..], &2u64.to_le_bytes(), b"/a", &[0]].concat()
        );
    }
}

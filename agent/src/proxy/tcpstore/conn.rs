//! One torch connection: the handshake, then one request at a time, as torch's client sends them.
//!
//! torch's client never reconnects: a connection that breaks ends its process's store (and, in
//! torchrun, the job). So this task holds the connection for its whole life, and nothing the
//! ensemble does (a leader change mid-call, an election) reaches it: each call is sent through
//! the proxy's failover and answered when the ensemble has answered. What does close the
//! connection is what closes it on torch's own server: bad input (a first message that is not
//! VALIDATE with torch's magic number, an unknown query type, a key or value over torch's limits,
//! a truncated frame) and a request the store refuses (ADD to a value that is not a number, a
//! value over the ensemble's `--max-value-bytes`); each is logged, naming the peer and the problem.
//!
//! A WAIT (or BARRIER) stays parked on the leader until its keys exist; meanwhile the connection
//! is read too, since the client's own timeout sends CANCEL_WAIT: the parked call is then dropped
//! (which cancels it on the leader) and WAIT_CANCELED answered. A CANCEL_WAIT that crosses the
//! STOP_WAITING already sent is answered WAIT_CANCELED as a request of its own, which is what the
//! client reads after it.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use super::codec::{
    query, read_request, FrameError, Reply, Request, MAGIC, NOT_READY, READY, STOP_WAITING,
    WAIT_CANCELED,
};
use super::ops::Store;
use super::order::WriteOrder;

/// Bytes a connection reads ahead (see [`serve`]).
const READ_BUFFER: usize = 1 << 10;

/// Why a connection ended other than by its client closing it.
#[derive(Debug, thiserror::Error)]
enum Closed {
    #[error("{0}")]
    Frame(#[from] FrameError),
    #[error("the first message must be VALIDATE with magic {MAGIC:#x}, got query type {0}")]
    NotValidated(u8),
    #[error("bad magic {0:#x} in VALIDATE (torch's is {MAGIC:#x})")]
    BadMagic(u32),
    #[error("query type {0} sent while a WAIT or BARRIER was pending (only CANCEL_WAIT may be)")]
    WhileWaiting(u8),
    #[error("{request}: the ensemble answered {code:?}: {message}")]
    Refused {
        request: &'static str,
        code: tonic::Code,
        message: String,
    },
    #[error("writing to the client failed: {0}")]
    Write(std::io::Error),
}

fn refused(request: &'static str) -> impl Fn(tonic::Status) -> Closed {
    move |s| Closed::Refused {
        request,
        code: s.code(),
        // With the errors behind it: a broken connection to the ensemble says only "h2 protocol
        // error" on its own.
        message: crate::client::describe(&s),
    }
}

/// Serves one accepted connection to its end; logs why it ended if that was not the client.
pub async fn serve(stream: TcpStream, store: Store, order: Arc<WriteOrder>) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut conn = Conn {
        // A connection keeps its buffer for as long as its job runs. torch's requests are a few
        // dozen bytes but for values, and a read larger than the buffer goes past it into the
        // value's own; 8 KiB each was a sidecar's 12,500 connections' first 100 MB.
        rd: BufReader::with_capacity(READ_BUFFER, rd),
        wr,
        store,
        order,
    };
    if let Err(e) = conn.run().await {
        eprintln!(
            "coord-proxy: tcpstore: closing the connection of {}: {e}",
            shown(peer)
        );
    }
}

fn shown(peer: Option<SocketAddr>) -> String {
    peer.map_or_else(|| "an unknown peer".to_string(), |p| p.to_string())
}

struct Conn {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    store: Store,
    order: Arc<WriteOrder>,
}

impl Conn {
    async fn run(&mut self) -> Result<(), Closed> {
        let Some(first) = self.next_op().await? else {
            return Ok(());
        };
        if first != query::VALIDATE {
            return Err(Closed::NotValidated(first));
        }
        match read_request(first, &mut self.rd).await? {
            Request::Validate(MAGIC) => {}
            Request::Validate(other) => return Err(Closed::BadMagic(other)),
            _ => return Err(Closed::NotValidated(first)),
        }
        while let Some(op) = self.next_op().await? {
            let request = read_request(op, &mut self.rd).await?;
            let reply_less = matches!(
                request,
                Request::Set(..)
                    | Request::MultiSet(_)
                    | Request::Append(..)
                    | Request::QueuePush(..)
            );
            let (receipt, _pending) = self.order.receive(reply_less);
            self.order.earlier_done(receipt).await;
            let reply = self.answer(request).await?;
            if !reply.0.is_empty() {
                self.wr.write_all(&reply.0).await.map_err(Closed::Write)?;
            }
        }
        Ok(())
    }

    /// The next query-type byte; `None` when the client closed the connection between requests.
    async fn next_op(&mut self) -> Result<Option<u8>, Closed> {
        match self.rd.read_u8().await {
            Ok(op) => Ok(Some(op)),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(FrameError::Io(e).into()),
        }
    }

    async fn answer(&mut self, request: Request) -> Result<Reply, Closed> {
        let s = &self.store;
        let reply = Reply::default();
        Ok(match request {
            Request::Validate(MAGIC) => reply,
            Request::Validate(other) => return Err(Closed::BadMagic(other)),
            Request::Ping(nonce) => reply.u32(nonce),
            Request::Set(k, v) => {
                s.set(vec![(k, v)]).await.map_err(refused("SET"))?;
                reply
            }
            Request::MultiSet(pairs) => {
                s.set(pairs).await.map_err(refused("MULTI_SET"))?;
                reply
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                let v = s.compare_set(&key, expected, desired).await;
                reply.bytes(&v.map_err(refused("COMPARE_SET"))?)
            }
            Request::Get(k) => {
                let v = s.get(&[k]).await.map_err(refused("GET"))?;
                reply.bytes(v.first().map_or(&[][..], |b| b))
            }
            Request::MultiGet(keys) => {
                let values = s.get(&keys).await.map_err(refused("MULTI_GET"))?;
                values.iter().fold(reply, |r, v| r.bytes(v))
            }
            Request::Add(k, delta) => reply.i64(s.add(&k, delta).await.map_err(refused("ADD"))?),
            Request::Append(k, v) => {
                s.append(&k, v).await.map_err(refused("APPEND"))?;
                reply
            }
            Request::DeleteKey(k) => reply.i64(s.delete(&k).await.map_err(refused("DELETE_KEY"))?),
            Request::Check(keys) => {
                let ready = s.check(&keys).await.map_err(refused("CHECK"))?;
                reply.u8(if ready { READY } else { NOT_READY })
            }
            Request::GetNumKeys => {
                let (n, _) = s.list(false).await.map_err(refused("GETNUMKEYS"))?;
                reply.i64(n)
            }
            Request::ListKeys => {
                let (_, keys) = s.list(true).await.map_err(refused("LIST_KEYS"))?;
                let r = reply.i64(keys.len() as i64);
                keys.iter().fold(r, |r, k| r.bytes(k))
            }
            Request::QueuePush(k, v) => {
                s.queue_push(&k, v).await.map_err(refused("QUEUE_PUSH"))?;
                reply
            }
            Request::QueuePop(k) => {
                let (length, value) = s.queue_pop(&k).await.map_err(refused("QUEUE_POP"))?;
                let r = reply.i64(length);
                match value {
                    Some(v) => r.bytes(&v),
                    None => r,
                }
            }
            Request::QueueLen(k) => reply.i64(s.queue_len(&k).await.map_err(refused("QUEUE_LEN"))?),
            Request::CancelWait => reply.u8(WAIT_CANCELED),
            Request::Wait(keys) => self.wait(Pending::Keys(keys)).await?,
            Request::Barrier(k, world_size) => self.wait(Pending::Barrier(k, world_size)).await?,
        })
    }

    /// A WAIT or BARRIER: parked on the leader until it is over, or cancelled by the client.
    async fn wait(&mut self, pending: Pending) -> Result<Reply, Closed> {
        let s = &self.store;
        let call = async {
            match &pending {
                Pending::Keys(keys) => s.wait(keys).await.map_err(refused("WAIT")),
                Pending::Barrier(k, n) => s
                    .barrier(k, *n)
                    .await
                    .map(|_| ())
                    .map_err(refused("BARRIER")),
            }
        };
        tokio::select! {
            done = call => {
                done?;
                Ok(Reply::default().u8(STOP_WAITING))
            }
            next = self.rd.read_u8() => match next {
                Ok(query::CANCEL_WAIT) => Ok(Reply::default().u8(WAIT_CANCELED)),
                Ok(other) => Err(Closed::WhileWaiting(other)),
                // The client went away while waiting: the wait ends with it.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(Reply::default()),
                Err(e) => Err(FrameError::Io(e).into()),
            },
        }
    }
}

/// What a parked request waits for.
enum Pending {
    Keys(Vec<Bytes>),
    Barrier(Bytes, i64),
}

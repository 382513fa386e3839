//! A client of torch's TCPStore wire, sending what torch 2.15's C++ client sends, byte for byte
//! (`agent/src/proxy/tcpstore/codec.rs` has the frames and the reference in `docs/`): for
//! coord-bench, which simulates thousands of ranks on one tokio runtime, and measures torch's own
//! store and coord-proxy with the same client.
//!
//! Like torch's, a client is one TCP connection with one request in flight; a GET is a WAIT for
//! the key and then the GET, as torch's `TCPStore::get` does. Keys are sent as given (torch's
//! client prefixes them with `/`; so should the caller).

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use coord_agent::proxy::tcpstore::codec::{query, MAGIC, STOP_WAITING, WAIT_CANCELED};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};

pub struct StoreClient {
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
}

/// A request being written.
#[derive(Default)]
struct Frame(Vec<u8>);

impl Frame {
    fn op(op: u8) -> Self {
        Self(vec![op])
    }

    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    fn bytes(self, v: &[u8]) -> Self {
        let mut f = self.u64(v.len() as u64);
        f.0.extend_from_slice(v);
        f
    }
}

/// Leaves the choice of `socket`'s local port to its connect, which knows the server's address
/// too (`IP_BIND_ADDRESS_NO_PORT`). A bind to port 0 would pick a port that no socket on the
/// source address holds toward any server, TIME_WAIT ones included: after a round of 10,000 ranks,
/// the next round's 10,000 took 7 to 49 s to connect instead of 0.6 s.
fn pick_port_at_connect(socket: &TcpSocket) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the descriptor is the open socket `socket` owns, and the option value is a c_int
    // that outlives the call, its size given.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_BIND_ADDRESS_NO_PORT,
            std::ptr::from_ref(&on).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    match set {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn unexpected(what: &str, got: u8) -> std::io::Error {
    std::io::Error::other(format!("{what}: unexpected reply byte {got}"))
}

impl StoreClient {
    /// Connects and shakes hands as torch does: VALIDATE with the magic number and a PING with a
    /// nonce, in one segment, then the echo.
    pub async fn connect(addr: &str) -> std::io::Result<Self> {
        Self::shake_hands(TcpStream::connect(addr).await?).await
    }

    /// [`Self::connect`] from the local address `source` where `addr` is an IPv4 loopback address
    /// and `source` one too; from wherever the kernel picks otherwise (IPv6 has one loopback
    /// address). One source address has at most the ephemeral port range of connections to one
    /// server address (28,232 with Linux's default `ip_local_port_range`), and every address of
    /// 127.0.0.0/8 is this host's: coord-bench's 100,000 simulated ranks connect from several.
    pub async fn connect_from(addr: &str, source: IpAddr) -> std::io::Result<Self> {
        let to = tokio::net::lookup_host(addr)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{addr} names no address")))?;
        let stream = match (to, source) {
            (SocketAddr::V4(v4), IpAddr::V4(_)) if v4.ip().is_loopback() => {
                let socket = TcpSocket::new_v4()?;
                pick_port_at_connect(&socket)?;
                socket.bind(SocketAddr::new(source, 0))?;
                socket.connect(to).await?
            }
            _ => TcpStream::connect(to).await?,
        };
        Self::shake_hands(stream).await
    }

    async fn shake_hands(stream: TcpStream) -> std::io::Result<Self> {
        stream.set_nodelay(true)?;
        let (rd, wr) = stream.into_split();
        let mut c = Self {
            // Replies are a few bytes but for values, which are read past the buffer: coord-bench
            // holds 100,000 of these on two cores, and 8 KiB each (tokio's default) was 800 MB of
            // fresh pages for the kernel to clear, on the cores the stores it measures run on.
            rd: BufReader::with_capacity(1 << 10, rd),
            wr,
        };
        let nonce = std::process::id();
        let mut hello = Frame::op(query::VALIDATE).u32(MAGIC).0;
        hello.extend(Frame::op(query::PING).u32(nonce).0);
        c.wr.write_all(&hello).await?;
        let echo = c.rd.read_u32_le().await?;
        if echo != nonce {
            return Err(std::io::Error::other(format!(
                "PING echoed {echo}, not {nonce}"
            )));
        }
        Ok(c)
    }

    async fn send(&mut self, f: Frame) -> std::io::Result<()> {
        self.wr.write_all(&f.0).await
    }

    async fn read_bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let len = self.rd.read_u64_le().await?;
        if len > coord_agent::proxy::tcpstore::codec::MAX_VALUE_BYTES {
            return Err(std::io::Error::other(format!("a value of {len} bytes")));
        }
        let mut v = vec![0; len as usize];
        self.rd.read_exact(&mut v).await?;
        Ok(v)
    }

    /// PING with this process's id as the nonce; the echo.
    pub async fn ping(&mut self) -> std::io::Result<()> {
        let nonce = std::process::id();
        self.send(Frame::op(query::PING).u32(nonce)).await?;
        match self.rd.read_u32_le().await? {
            echo if echo == nonce => Ok(()),
            echo => Err(std::io::Error::other(format!(
                "PING echoed {echo}, not {nonce}"
            ))),
        }
    }

    pub async fn set(&mut self, key: &[u8], value: &[u8]) -> std::io::Result<()> {
        self.send(Frame::op(query::SET).bytes(key).bytes(value))
            .await
    }

    /// torch's `get`: a WAIT for the key, then the GET.
    pub async fn get(&mut self, key: &[u8]) -> std::io::Result<Vec<u8>> {
        self.wait(&[key]).await?;
        self.send(Frame::op(query::GET).bytes(key)).await?;
        self.read_bytes().await
    }

    pub async fn add(&mut self, key: &[u8], delta: i64) -> std::io::Result<i64> {
        self.send(Frame::op(query::ADD).bytes(key).i64(delta))
            .await?;
        self.rd.read_i64_le().await
    }

    /// COMPARE_SET; the value after the call.
    pub async fn compare_set(
        &mut self,
        key: &[u8],
        expected: &[u8],
        desired: &[u8],
    ) -> std::io::Result<Vec<u8>> {
        let f = Frame::op(query::COMPARE_SET)
            .bytes(key)
            .bytes(expected)
            .bytes(desired);
        self.send(f).await?;
        self.read_bytes().await
    }

    /// Sends a WAIT for `keys` without reading its answer (see [`Self::waited`]).
    pub async fn start_wait(&mut self, keys: &[&[u8]]) -> std::io::Result<()> {
        let mut f = Frame::op(query::WAIT).u64(keys.len() as u64);
        for k in keys {
            f = f.bytes(k);
        }
        self.send(f).await
    }

    /// The STOP_WAITING that ends a WAIT sent by [`Self::start_wait`].
    pub async fn waited(&mut self) -> std::io::Result<()> {
        match self.rd.read_u8().await? {
            STOP_WAITING => Ok(()),
            other => Err(unexpected("WAIT", other)),
        }
    }

    /// CANCEL_WAIT of a WAIT sent by [`Self::start_wait`], as torch's client sends it at its
    /// timeout: the WAIT_CANCELED answer.
    pub async fn cancel_wait(&mut self) -> std::io::Result<()> {
        self.send(Frame::op(query::CANCEL_WAIT)).await?;
        match self.rd.read_u8().await? {
            WAIT_CANCELED => Ok(()),
            other => Err(unexpected("CANCEL_WAIT", other)),
        }
    }

    /// WAIT until every key exists (no timeout: the caller bounds it).
    pub async fn wait(&mut self, keys: &[&[u8]]) -> std::io::Result<()> {
        self.start_wait(keys).await?;
        self.waited().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection from another loopback address arrives from it, handshake and all: the
    /// 100,000-rank runs of coord-bench depend on it.
    #[tokio::test]
    async fn connects_from_the_given_loopback_address() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (mut s, peer) = listener.accept().await.unwrap();
            // VALIDATE (op, magic) and PING (op, nonce); the nonce echoed.
            let mut hello = [0u8; 10];
            s.read_exact(&mut hello).await.unwrap();
            s.write_all(&hello[6..]).await.unwrap();
            peer
        });
        let source: IpAddr = "127.0.0.3".parse().unwrap();
        let _client = StoreClient::connect_from(&addr, source).await.unwrap();
        assert_eq!(server.await.unwrap().ip(), source);
    }
}

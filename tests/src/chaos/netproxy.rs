//! A TCP proxy in front of each replica's peer address, to cut links between replicas.
//!
//! Replicas reach each other through these proxies (the membership addresses are the proxies'),
//! and each replica binds its outgoing connections to its own loopback address
//! (`--peer-source-ip 127.0.0.<10+id>`), so the proxy knows which replica a connection comes from.
//! Each direction of each link can then be cut on its own:
//!
//! - [`Cut::Refuse`]: new connections are refused and open ones reset (a host that is down or a
//!   firewall that rejects);
//! - [`Cut::Blackhole`]: bytes stop flowing until the link heals, the connections stay open (a
//!   partition that drops packets; TCP delivers what was held once it heals).
//!
//! Clients talk to the replicas' own ports, not through the proxies.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Cut {
    Refuse,
    Blackhole,
}

/// Which directed links are cut. Every change is published so that pumps re-check at once.
struct Links {
    cut: Mutex<HashMap<(u64, u64), Cut>>,
    changed: watch::Sender<u64>,
}

impl Links {
    fn state(&self, from: u64, to: u64) -> Option<Cut> {
        self.cut
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(from, to))
            .copied()
    }

    fn set(&self, from: u64, to: u64, cut: Option<Cut>) {
        {
            let mut g = self.cut.lock().unwrap_or_else(PoisonError::into_inner);
            match cut {
                Some(c) => g.insert((from, to), c),
                None => g.remove(&(from, to)),
            };
        }
        self.changed.send_modify(|v| *v += 1);
    }
}

/// The proxies of one ensemble; dropping it stops them.
pub struct NetProxy {
    runtime: Option<tokio::runtime::Runtime>,
    links: Arc<Links>,
    proxies: HashMap<u64, SocketAddr>,
}

/// The loopback address replica `id` sends from.
pub fn source_ip(id: u64) -> IpAddr {
    IpAddr::from([127, 0, 0, u8::try_from(10 + id).unwrap_or(255)])
}

impl NetProxy {
    /// Starts one proxy per `(replica id, replica address)`; `listen` gives each proxy's address.
    pub fn start(targets: &[(u64, SocketAddr, SocketAddr)]) -> std::io::Result<Self> {
        // Bound before the runtime exists, so that a failure (a port taken meanwhile) returns
        // the error instead of dropping a runtime inside the caller's async context.
        let mut listeners = Vec::new();
        for &(id, proxy, target) in targets {
            let listener = std::net::TcpListener::bind(proxy).map_err(|e| {
                std::io::Error::new(e.kind(), format!("proxy for replica {id} on {proxy}: {e}"))
            })?;
            listener.set_nonblocking(true)?;
            listeners.push((id, proxy, target, listener));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("chaos-netproxy")
            .enable_all()
            .build()?;
        let links = Arc::new(Links {
            cut: Mutex::new(HashMap::new()),
            changed: watch::channel(0).0,
        });
        let sources: Arc<HashMap<IpAddr, u64>> = Arc::new(
            targets
                .iter()
                .map(|(id, _, _)| (source_ip(*id), *id))
                .collect(),
        );
        let mut proxies = HashMap::new();
        for (id, proxy, target, listener) in listeners {
            // Bound above (not with `block_on`) so that a proxy can be started from async code.
            proxies.insert(id, proxy);
            let (links, sources) = (links.clone(), sources.clone());
            runtime.spawn(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                while let Ok((conn, from)) = listener.accept().await {
                    let src = sources.get(&from.ip()).copied();
                    tokio::spawn(relay(conn, src, id, target, links.clone()));
                }
            });
        }
        Ok(Self {
            runtime: Some(runtime),
            links,
            proxies,
        })
    }

    pub fn proxy_of(&self, id: u64) -> SocketAddr {
        self.proxies[&id]
    }

    /// Cuts the link from replica `from` to replica `to` (one direction).
    pub fn cut(&self, from: u64, to: u64, how: Cut) {
        self.links.set(from, to, Some(how));
    }

    pub fn heal(&self, from: u64, to: u64) {
        self.links.set(from, to, None);
    }

    /// Cuts replica `id` off from every other replica, both directions.
    pub fn isolate(&self, id: u64, how: Cut) {
        for &other in self.proxies.keys().filter(|&&o| o != id) {
            self.cut(id, other, how);
            self.cut(other, id, how);
        }
    }

    pub fn heal_all(&self) {
        self.links
            .cut
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.links.changed.send_modify(|v| *v += 1);
    }
}

impl Drop for NetProxy {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Carries one connection from replica `src` (`None` = not a replica: never cut) to replica `dst`.
async fn relay(
    inbound: TcpStream,
    src: Option<u64>,
    dst: u64,
    target: SocketAddr,
    links: Arc<Links>,
) {
    if let Some(s) = src {
        if links.state(s, dst) == Some(Cut::Refuse) {
            return;
        }
    }
    let Ok(outbound) = TcpStream::connect(target).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    let forward = pump(in_read, out_write, src.map(|s| (s, dst)), links.clone());
    let backward = pump(out_read, in_write, src.map(|s| (dst, s)), links);
    // When either direction ends, the connection is done.
    tokio::select! {
        () = forward => {}
        () = backward => {}
    }
}

/// Copies bytes one way, obeying the cut state of `link` (from, to).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Option<(u64, u64)>,
    links: Arc<Links>,
) {
    let mut changed = links.changed.subscribe();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            c = changed.changed() => {
                if c.is_err() {
                    return;
                }
                if link.is_some_and(|(a, b)| links.state(a, b) == Some(Cut::Refuse)) {
                    return;
                }
                continue;
            }
        };
        // Hold the bytes while the link is blackholed; drop the connection if it is refused.
        loop {
            match link.and_then(|(a, b)| links.state(a, b)) {
                None => break,
                Some(Cut::Refuse) => return,
                Some(Cut::Blackhole) => {
                    if changed.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

//! Per-client admission at the replica a client talks to: a request rate (token bucket) and a cap
//! on blocking calls in flight (blocking gets, barrier waits, WaitForAllTasks, error polls).
//!
//! A client is its request-id client (`coord-request-id`), or, for a request without one, the
//! connection it came on. Requests forwarded by another replica were admitted where they entered
//! and pass; Raft traffic never comes through here. Past a limit the request fails
//! `RESOURCE_EXHAUSTED` before it touches anything, with a message naming the client and the
//! flag; the replica itself stays healthy.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tonic::Status;

/// Who a request counts against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientKey {
    Id(u64),
    Connection(SocketAddr),
    /// No id and no address (not over TCP): one shared bucket.
    Unknown,
}

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientKey::Id(id) => write!(f, "client {id:#x}"),
            ClientKey::Connection(a) => write!(f, "the client at {a}"),
            ClientKey::Unknown => write!(f, "an unidentified client"),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct LimitConfig {
    /// Requests a second per client (0: no limit); a client may burst one second's worth.
    pub requests_per_second: u32,
    /// Blocking calls in flight per client (0: no limit).
    pub blocking_calls: usize,
}

struct ClientState {
    tokens: f64,
    refilled: Instant,
    blocking: usize,
}

/// Clients idle this long (and with nothing in flight) are forgotten.
const IDLE: Duration = Duration::from_secs(30);
/// The client table is swept for idle clients once it holds this many more than after the last
/// sweep.
const SWEEP_GROWTH: usize = 4096;

pub struct Limits {
    config: LimitConfig,
    clients: Mutex<(HashMap<ClientKey, ClientState>, usize)>,
}

/// A blocking call's place in its client's count; released when dropped.
pub struct Permit {
    limits: Arc<Limits>,
    key: ClientKey,
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(c) = self.limits.lock().0.get_mut(&self.key) {
            c.blocking = c.blocking.saturating_sub(1);
        }
    }
}

impl Limits {
    pub fn new(config: LimitConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            clients: Mutex::new((HashMap::new(), 0)),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (HashMap<ClientKey, ClientState>, usize)> {
        self.clients.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits one request of `key` to `method`; `blocking` calls also take a [`Permit`].
    pub fn admit(
        self: &Arc<Self>,
        key: ClientKey,
        method: &str,
        blocking: bool,
    ) -> Result<Option<Permit>, Status> {
        let LimitConfig {
            requests_per_second: rate,
            blocking_calls,
        } = self.config;
        if rate == 0 && (blocking_calls == 0 || !blocking) {
            return Ok(None);
        }
        let now = Instant::now();
        let mut guard = self.lock();
        let (clients, swept_at) = &mut *guard;
        if clients.len() > *swept_at + SWEEP_GROWTH {
            clients.retain(|_, c| c.blocking > 0 || now.duration_since(c.refilled) < IDLE);
            *swept_at = clients.len();
        }
        let c = clients.entry(key).or_insert(ClientState {
            tokens: f64::from(rate),
            refilled: now,
            blocking: 0,
        });
        if rate > 0 {
            let rate = f64::from(rate);
            c.tokens = (c.tokens + now.duration_since(c.refilled).as_secs_f64() * rate).min(rate);
            c.refilled = now;
            if c.tokens < 1.0 {
                return Err(Status::resource_exhausted(format!(
                    "{key} sends more than {rate} requests a second (--max-requests-per-second-per-client); {method} refused, retry later"
                )));
            }
            c.tokens -= 1.0;
        }
        if !blocking || blocking_calls == 0 {
            return Ok(None);
        }
        if c.blocking >= blocking_calls {
            return Err(Status::resource_exhausted(format!(
                "{key} already has {} blocking calls in flight (--max-blocking-calls-per-client); {method} refused",
                c.blocking
            )));
        }
        c.blocking += 1;
        Ok(Some(Permit {
            limits: self.clone(),
            key,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_and_blocking_limits_refuse_and_recover() {
        let limits = Limits::new(LimitConfig {
            requests_per_second: 5,
            blocking_calls: 2,
        });
        let a = ClientKey::Id(0xa);
        for _ in 0..5 {
            limits.admit(a, "Get", false).expect("within the burst");
        }
        let err = limits.admit(a, "Get", false).err().expect("over the rate");
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(err.message().contains("client 0xa"), "{err}");
        // Another client has its own bucket.
        limits
            .admit(ClientKey::Id(0xb), "Get", false)
            .expect("other client");
        std::thread::sleep(Duration::from_millis(250));
        limits.admit(a, "Get", false).expect("refilled");

        let limits = Limits::new(LimitConfig {
            requests_per_second: 0,
            blocking_calls: 2,
        });
        let p1 = limits.admit(a, "GetKeyValue", true).expect("first");
        let _p2 = limits.admit(a, "GetKeyValue", true).expect("second");
        let err = limits.admit(a, "GetKeyValue", true).err().expect("third");
        assert!(err.message().contains("2 blocking calls"), "{err}");
        limits
            .admit(a, "TryGetKeyValue", false)
            .expect("not blocking");
        drop(p1);
        limits
            .admit(a, "GetKeyValue", true)
            .expect("a slot was freed");
    }
}

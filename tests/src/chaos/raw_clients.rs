//! The raw-key clients of a chaos run: torch's store operations, called exactly as coord-proxy
//! calls them for one torch connection ([`Store`]: a session of request ids of its own, failover,
//! parked calls parked again on the next leader), so the run sees whether each applies once.
//!
//! Every client mixes ADD and GET of one counter, COMPARE_SET and GET of one register, APPEND,
//! QUEUE_PUSH, QUEUE_POP, arrivals at the next instance of a counted BARRIER that all of them
//! pass, and a WAIT for a key a task of its own sets a little later. [`finish`] reads what the
//! keys hold at the end; `raw::check` and the key-value checker judge it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use coord_agent::proxy::tcpstore::Store;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::history::{History, KvRecord};
use super::linearize::{KvOp, KvRet};
use super::raw::{RawFinal, RawOp, RawRecord, RawRet, TOKEN_END};
use super::{stopped, Endpoints};

/// Every raw key of a run lives under this prefix (as coord-proxy's `--tcpstore-prefix`).
const PREFIX: &[u8] = b"chaos/raw/";
const COUNTER: &str = "radd";
const REGISTER: &str = "rcas";
const LOG: &str = "rlog";
const QUEUE: &str = "rq";

/// The key-value histories' name of raw key `key` (kept apart from the coordination keys).
fn history_key(key: &str) -> String {
    format!("raw:{key}")
}

fn barrier_key(instance: u64) -> String {
    format!("rbar/{instance}")
}

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What the clients share: who arrived at which barrier instance, for the recovery check.
#[derive(Default)]
struct Arrivals {
    /// Per instance, each arrival's invocation time; `None`: an arrival of unknown outcome.
    by_instance: Mutex<BTreeMap<u64, Vec<Option<u64>>>>,
}

impl Arrivals {
    fn record(&self, instance: u64, at: Option<u64>) {
        self.by_instance
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(instance)
            .or_default()
            .push(at);
    }

    /// When the last of `world` clients arrived at `instance`, if all did with a known outcome:
    /// only from then on is a parked arrival the service's to answer.
    fn all_arrived(&self, instance: u64, world: usize) -> Option<u64> {
        let map = self
            .by_instance
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let at = map.get(&instance)?;
        if at.len() < world {
            return None;
        }
        at.iter().try_fold(0, |last, a| a.map(|a| a.max(last)))
    }

    fn instances(&self) -> Vec<u64> {
        self.by_instance
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
    }
}

/// The raw-key clients of one run.
pub struct RawClients {
    handles: Vec<JoinHandle<()>>,
    arrivals: Arc<Arrivals>,
    world: usize,
}

/// Starts `clients` raw-key clients on `target`.
pub fn start(
    target: &Endpoints,
    history: &Arc<History>,
    stop: &Arc<AtomicBool>,
    clients: usize,
    unavailable_after: Duration,
    seed: u64,
) -> RawClients {
    let arrivals = Arc::new(Arrivals::default());
    // One proxy's stores: a session per client, the GET flights shared (as coord-proxy's
    // connections share them).
    let stores = Arc::new(Store::new(
        target.client(unavailable_after),
        Bytes::from_static(PREFIX),
    ));
    let handles = (0..clients)
        .map(|id| {
            let c = Client {
                id,
                world: clients,
                stores: stores.clone(),
                history: history.clone(),
                stop: stop.clone(),
                arrivals: arrivals.clone(),
            };
            tokio::spawn(c.run(seed.wrapping_add(id as u64 * 104_729)))
        })
        .collect();
    RawClients {
        handles,
        arrivals,
        world: clients,
    }
}

impl RawClients {
    pub fn handles(&mut self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut self.handles)
    }
}

struct Client {
    id: usize,
    world: usize,
    stores: Arc<Store>,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
    arrivals: Arc<Arrivals>,
}

impl Client {
    fn store(&self) -> Store {
        self.stores.sibling()
    }

    async fn run(self, seed: u64) {
        let mut rng = StdRng::seed_from_u64(seed);
        let store = self.store();
        let (mut n, mut instance) = (0u64, 0u64);
        // The register's value as this client last saw it: what its next COMPARE_SET expects.
        let mut seen = String::new();
        while !self.stop.load(Ordering::Relaxed) {
            n += 1;
            let token = format!("c{}.{n}", self.id);
            match rng.gen_range(0..100) {
                0..=19 => self.add(&store).await,
                20..=27 => {
                    self.read(&store, COUNTER).await;
                }
                28..=39 => {
                    let expected = if rng.gen_bool(0.2) {
                        "stale".to_string()
                    } else {
                        seen.clone()
                    };
                    if let Some(v) = self.compare_set(&store, expected, token).await {
                        seen = v;
                    }
                }
                40..=44 => {
                    if let Some(v) = self.read(&store, REGISTER).await {
                        seen = v;
                    }
                }
                45..=56 => self.append(&store, token).await,
                57..=68 => self.push(&store, token).await,
                69..=80 => self.pop(&store).await,
                81..=89 => {
                    self.arrive(&store, instance).await;
                    instance += 1;
                }
                _ => {
                    let delay = Duration::from_millis(rng.gen_range(20..300));
                    self.wait(&store, format!("rw/{token}"), delay).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(2..15))).await;
        }
    }

    fn record(&self, op: RawOp, invoke: u64, ret: Option<RawRet>) {
        let h = &self.history;
        let what = format!("{op:?} by raw client {}", self.id);
        h.record_call(what, invoke, ret.is_some());
        h.record_raw(RawRecord {
            client: self.id,
            op,
            complete_us: ret.is_some().then(|| h.now_us()),
            ret,
            invoke_us: invoke,
        });
    }

    fn record_kv(&self, key: &str, op: KvOp, invoke: u64, ret: Option<KvRet>) {
        let h = &self.history;
        h.record_call(
            format!("{op:?} of raw key {key:?} by raw client {}", self.id),
            invoke,
            ret.is_some(),
        );
        h.record_kv(KvRecord {
            client: 1000 + self.id,
            key: history_key(key),
            op,
            complete_us: ret.is_some().then(|| h.now_us()),
            ret,
            invoke_us: invoke,
        });
    }

    async fn add(&self, store: &Store) {
        let invoke = self.history.now_us();
        let r = store.add(COUNTER.as_bytes(), 1).await.ok();
        self.record_kv(COUNTER, KvOp::Increment(1), invoke, r.map(KvRet::Number));
    }

    /// A GET (a missing key reads empty, as torch's server answers); a failed read is not
    /// recorded as an operation: it tells nothing and changed nothing.
    async fn read(&self, store: &Store, key: &str) -> Option<String> {
        let invoke = self.history.now_us();
        match store.get(&[Bytes::from(key.to_string())]).await {
            Ok(v) => {
                let v = v.first().map(text).unwrap_or_default();
                let value = (!v.is_empty()).then(|| v.clone());
                self.record_kv(key, KvOp::Get, invoke, Some(KvRet::Value(value)));
                Some(v)
            }
            Err(_) => {
                let what = format!("GET of raw key {key:?} by raw client {}", self.id);
                self.history.record_call(what, invoke, false);
                None
            }
        }
    }

    async fn compare_set(
        &self,
        store: &Store,
        expected: String,
        desired: String,
    ) -> Option<String> {
        let invoke = self.history.now_us();
        let r = store
            .compare_set(
                REGISTER.as_bytes(),
                Bytes::from(expected.clone()),
                Bytes::from(desired.clone()),
            )
            .await
            .ok()
            .map(|v| text(&v));
        let op = KvOp::CompareSet { expected, desired };
        self.record_kv(
            REGISTER,
            op,
            invoke,
            r.clone().map(|v| KvRet::Value(Some(v))),
        );
        r
    }

    async fn append(&self, store: &Store, token: String) {
        let invoke = self.history.now_us();
        let value = Bytes::from(format!("{token}{TOKEN_END}"));
        let r = store.append(LOG.as_bytes(), value).await.ok();
        self.record(RawOp::Append(token), invoke, r.map(|()| RawRet::Ok));
    }

    async fn push(&self, store: &Store, token: String) {
        let invoke = self.history.now_us();
        let r = store
            .queue_push(QUEUE.as_bytes(), Bytes::from(token.clone()))
            .await;
        self.record(RawOp::Push(token), invoke, r.ok().map(|()| RawRet::Ok));
    }

    async fn pop(&self, store: &Store) {
        let invoke = self.history.now_us();
        let r = store.queue_pop(QUEUE.as_bytes()).await.ok();
        let ret = r.map(|(_, v)| RawRet::Popped(v.as_ref().map(text)));
        self.record(RawOp::Pop, invoke, ret);
    }

    /// One arrival at barrier `instance`. It counts only from when every client has arrived (a
    /// client still busy elsewhere is not the service's delay); an arrival of unknown outcome
    /// moves on (arriving again would count twice).
    async fn arrive(&self, store: &Store, instance: u64) {
        let invoke = self.history.now_us();
        let key = barrier_key(instance);
        let call = store.barrier(key.as_bytes(), self.world as i64);
        let r = tokio::select! {
            r = call => r.ok(),
            () = stopped(&self.stop) => None,
        };
        self.arrivals
            .record(instance, r.is_some().then_some(invoke));
        let h = &self.history;
        if let Some(from) = self.arrivals.all_arrived(instance, self.world) {
            let what = format!("BARRIER #{instance} by raw client {}", self.id);
            h.record_call(what, invoke.max(from), r.is_some());
        }
        h.record_raw(RawRecord {
            client: self.id,
            op: RawOp::Barrier(instance),
            complete_us: r.is_some().then(|| h.now_us()),
            ret: r.map(RawRet::Count),
            invoke_us: invoke,
        });
    }

    /// A WAIT for `key`, which a task of this client sets after `delay` with a session of its
    /// own. The wait counts from when the set began; if the set's outcome is unknown, the wait
    /// may rightly never end and is not timed.
    async fn wait(&self, store: &Store, key: String, delay: Duration) {
        let invoke = self.history.now_us();
        let set_began = Arc::new(AtomicU64::new(0));
        let setter = {
            let (store, key, began, h) = (
                self.store(),
                key.clone(),
                set_began.clone(),
                self.history.clone(),
            );
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                began.store(h.now_us().max(1), Ordering::SeqCst);
                let pair = (Bytes::from(key), Bytes::from_static(b"set"));
                store.set(vec![pair]).await.is_ok()
            })
        };
        let keys = [Bytes::from(key.clone())];
        let waited = tokio::select! {
            r = store.wait(&keys) => Some(r.is_ok()),
            () = stopped(&self.stop) => None,
        };
        let set_at = |b: &AtomicU64| Some(b.load(Ordering::SeqCst)).filter(|&t| t > 0);
        // Read before the setter is awaited: a release must not come before the set began.
        let began_at_release = set_at(&set_began);
        let complete = self.history.now_us();
        if waited.is_none() {
            setter.abort();
        }
        let set_acked = matches!(setter.await, Ok(true));
        let h = &self.history;
        if set_acked {
            let what = format!("WAIT of {key:?} by raw client {}", self.id);
            let from = set_at(&set_began).unwrap_or(invoke).max(invoke);
            h.record_call(what, from, waited == Some(true));
        }
        let released = waited == Some(true);
        h.record_raw(RawRecord {
            client: self.id,
            op: RawOp::Wait(key),
            ret: released.then_some(RawRet::Released(began_at_release)),
            invoke_us: invoke,
            complete_us: released.then_some(complete),
        });
    }
}

/// Once the clients have stopped: reads the counter and the register into the key-value
/// histories, and keeps what the appended value, the queue (popped until empty) and every barrier
/// counter hold, for `raw::check`. Returns what could not be read.
pub async fn finish(target: &Endpoints, history: &History, raw: &RawClients) -> Vec<String> {
    let store = Store::new(
        target.client(Duration::from_secs(30)),
        Bytes::from_static(PREFIX),
    );
    let mut failed = Vec::new();
    for key in [COUNTER, REGISTER] {
        let invoke = history.now_us();
        match store.get(&[Bytes::from(key)]).await {
            Ok(v) => {
                let v = v.first().map(text).filter(|v| !v.is_empty());
                history.record_kv(KvRecord {
                    client: usize::MAX,
                    key: history_key(key),
                    op: KvOp::Get,
                    ret: Some(KvRet::Value(v)),
                    invoke_us: invoke,
                    complete_us: Some(history.now_us()),
                });
            }
            Err(e) => failed.push(format!("final read of raw key {key:?} failed: {e}")),
        }
    }
    let mut end = RawFinal {
        world: raw.world as i64,
        ..RawFinal::default()
    };
    match store.get(&[Bytes::from(LOG)]).await {
        Ok(v) => end.log = v.first().map(text).unwrap_or_default(),
        Err(e) => failed.push(format!("final read of raw key {LOG:?} failed: {e}")),
    }
    loop {
        match store.queue_pop(QUEUE.as_bytes()).await {
            Ok((_, Some(v))) => end.drained.push(text(&v)),
            Ok((_, None)) => break,
            Err(e) => {
                failed.push(format!("draining raw queue {QUEUE:?} failed: {e}"));
                break;
            }
        }
    }
    for i in raw.arrivals.instances() {
        let key = barrier_key(i);
        match store.get(&[Bytes::from(key.clone())]).await {
            Ok(v) => {
                let count = v.first().and_then(|v| text(v).parse().ok()).unwrap_or(0);
                end.counters.insert(i, count);
            }
            Err(e) => failed.push(format!("final read of raw key {key:?} failed: {e}")),
        }
    }
    history.set_raw_final(end);
    failed
}

//! The parts of coord's wire contract carried as gRPC metadata, because the TensorFlow and XLA
//! schemas have no field for them: request ids (so a retried mutation applies once), leader
//! hints and the namespace a call acts in.
//!
//! A client numbers its mutations `seq = 1, 2, ...` under a random client id and may have several
//! in flight; with each it sends `acked_below`, the oldest `seq` still in flight, which tells the
//! ensemble that every older result was delivered and may be forgotten.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tonic::metadata::MetadataMap;

/// A mutation's request id: `<client>.<seq>.<acked_below>`, each a decimal u64 (one header, so
/// that it costs one HPACK literal per request).
pub const REQUEST_ID: &str = "coord-request-id";
/// Set by a replica forwarding a request to the leader; the leader never forwards it again.
pub const FORWARDED: &str = "coord-forwarded";
/// Marks an answer of the service, as opposed to a failure on the way to it. A status without it
/// whose code a broken connection produces (UNAVAILABLE, UNKNOWN, CANCELLED, INTERNAL) may be
/// retried with the same request id; one with it is the answer (e.g. CANCELLED from a cancelled
/// barrier, or the UNAVAILABLE error of a task that missed its heartbeats).
pub const FINAL: &str = "coord-final";

/// Whether a failed call may be sent again: not an answer of the service, and a code that a
/// broken connection or a missing leader produces.
pub fn is_retryable(s: &tonic::Status) -> bool {
    !s.metadata().contains_key(FINAL)
        && matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::Unknown
                | tonic::Code::Cancelled
                | tonic::Code::Internal
        )
}
/// On `UNAVAILABLE`: who leads, so the client can go there.
pub const LEADER_ID: &str = "coord-leader-id";
/// Sent by clients that answer `UNAVAILABLE` by trying another replica (coord's own clients).
/// A client without it (jaxlib's) takes `UNAVAILABLE` as fatal, so a replica holds its call
/// through elections instead.
pub const FAILS_OVER: &str = "coord-fails-over";
pub const LEADER_ADDR: &str = "coord-leader-addr";
/// The namespace a call acts in (absent: the default namespace). Set by coord-proxy
/// `--namespace` and coordctl `-n` on every call of a connection, never by TensorFlow's, JAX's
/// or torch's clients; over TLS a task certificate of a namespace binds it instead, and a header
/// naming another is refused.
pub const NAMESPACE: &str = "coord-namespace";

/// A mutation's request id as it travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireRequestId {
    pub client: u64,
    pub seq: u64,
    pub acked_below: u64,
}

impl WireRequestId {
    /// Reads the id from metadata: `None` if absent, an error naming the header if malformed.
    pub fn read(md: &MetadataMap) -> Result<Option<Self>, String> {
        let Some(v) = md.get(REQUEST_ID) else {
            return Ok(None);
        };
        let bad =
            || format!("metadata {REQUEST_ID} must be <client>.<seq>.<acked_below> (decimal u64s)");
        let text = v.to_str().map_err(|_| bad())?;
        let mut parts = text.split('.').map(|p| p.parse::<u64>().map_err(|_| bad()));
        let (Some(client), Some(seq), Some(acked_below), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        Ok(Some(Self {
            client: client?,
            seq: seq?,
            acked_below: acked_below?,
        }))
    }

    pub fn write(&self, md: &mut MetadataMap) {
        if let Ok(v) = format!("{}.{}.{}", self.client, self.seq, self.acked_below).parse() {
            md.insert(REQUEST_ID, v);
        }
    }
}

/// Hands out request ids for one client and tracks which are in flight.
pub struct RequestSession {
    client: u64,
    next: AtomicU64,
    in_flight: Mutex<BTreeSet<u64>>,
}

impl RequestSession {
    /// `client` must be unique among the ensemble's clients: pick it at random.
    pub fn new(client: u64) -> Arc<Self> {
        Arc::new(Self {
            client,
            next: AtomicU64::new(1),
            in_flight: Mutex::new(BTreeSet::new()),
        })
    }

    /// Starts a request; the returned ticket ends it when dropped (answered or abandoned).
    pub fn begin(self: &Arc<Self>) -> Ticket {
        // The number is taken and marked in flight under one lock: a request numbered between
        // another's numbering and its marking could otherwise acknowledge it (`acked_below` past
        // it) before it was even sent, and the ensemble would refuse it as a late duplicate.
        let (seq, acked_below) = {
            let mut f = self
                .in_flight
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let seq = self.next.fetch_add(1, Ordering::Relaxed);
            f.insert(seq);
            (seq, f.first().copied().unwrap_or(seq))
        };
        Ticket {
            session: self.clone(),
            id: WireRequestId {
                client: self.client,
                seq,
                acked_below,
            },
        }
    }
}

/// A request of a [`RequestSession`] in flight; keep it until the request's outcome is known.
pub struct Ticket {
    session: Arc<RequestSession>,
    pub id: WireRequestId,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.session
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acked_below_is_the_oldest_request_in_flight() {
        let s = RequestSession::new(7);
        let a = s.begin();
        let b = s.begin();
        assert_eq!(b.id.acked_below, a.id.seq);
        drop(a);
        let c = s.begin();
        assert_eq!(c.id.acked_below, b.id.seq);
    }

    /// Requests begun concurrently: none may acknowledge another that is still in flight.
    /// Ticket X (`acked_below` a) went out after its `begin` returned; every ticket numbered
    /// below a must have been done with (its drop begun) before that.
    #[test]
    fn concurrent_requests_never_acknowledge_one_in_flight() {
        use std::sync::atomic::AtomicU64;
        let s = RequestSession::new(7);
        let clock = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (s, clock) = (s.clone(), clock.clone());
                std::thread::spawn(move || {
                    let tick = || clock.fetch_add(1, Ordering::SeqCst);
                    let mut seen = Vec::new();
                    for _ in 0..20_000 {
                        let t = s.begin();
                        let went_out = tick();
                        let done = tick();
                        seen.push((t.id.seq, t.id.acked_below, went_out, done));
                        drop(t);
                    }
                    seen
                })
            })
            .collect();
        let mut all: Vec<(u64, u64, u64, u64)> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("thread"))
            .collect();
        all.sort_unstable();
        // latest_done[k]: the latest `done` among tickets numbered 1..=k (numbers are 1..=n).
        let mut latest_done = vec![0; all.len() + 1];
        for (i, t) in all.iter().enumerate() {
            assert_eq!(t.0, i as u64 + 1, "ticket numbers are 1..=n");
            latest_done[i + 1] = latest_done[i].max(t.3);
        }
        for &(seq, acked_below, went_out, _) in &all {
            assert!(
                (1..=seq).contains(&acked_below),
                "ticket {seq}: {acked_below}"
            );
            let below = latest_done[(acked_below - 1) as usize];
            assert!(
                acked_below == 1 || below < went_out,
                "ticket {seq} acknowledged everything below {acked_below} while one of those \
                 was still in flight"
            );
        }
    }

    #[test]
    fn metadata_round_trip_and_errors() {
        let id = WireRequestId {
            client: 5,
            seq: 9,
            acked_below: 3,
        };
        let mut md = MetadataMap::new();
        id.write(&mut md);
        assert_eq!(WireRequestId::read(&md), Ok(Some(id)));
        assert_eq!(WireRequestId::read(&MetadataMap::new()), Ok(None));
        for bad in ["x.1.1", "1.2", "1.2.3.4", "", "1..3", "-1.2.3"] {
            let mut md = MetadataMap::new();
            md.insert(REQUEST_ID, bad.parse().expect("ascii"));
            assert!(WireRequestId::read(&md).is_err(), "{bad:?} accepted");
        }
    }
}

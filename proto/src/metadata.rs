//! The parts of coord's wire contract carried as gRPC metadata, because the TensorFlow and XLA
//! schemas have no field for them: request ids (so a retried mutation applies once), leader
//! hints and the namespace a call acts in.
//!
//! A client numbers its mutations `seq = 1, 2, ...` under a random client id and may have several
//! in flight; with each it sends `acked_below`, the oldest `seq` still in flight, which tells the
//! ensemble that every older result was delivered and may be forgotten.

use std::collections::BTreeSet;
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

/// Marks `s` as an answer of the service (see [`FINAL`]).
pub fn mark_final(s: &mut tonic::Status) {
    s.metadata_mut()
        .insert(FINAL, tonic::metadata::MetadataValue::from_static("1"));
}

/// The service's error answer carried in a message's fields (one of several tasks answered
/// together, an arrival recorded for a call), marked as the task's own call's error is: an
/// answer, not a failure on the way to it.
pub fn final_status(code: i32, message: String, details: bytes::Bytes) -> tonic::Status {
    let mut s = tonic::Status::with_details(tonic::Code::from_i32(code), message, details);
    mark_final(&mut s);
    s
}

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

/// How far a lane's newest request number may run ahead of its oldest in flight (see
/// [`RequestSession`]). The ensemble keeps at most 16,384 results per client
/// (`MAX_RESULTS_PER_SESSION` in coord-raft-store's session table) and forgets the oldest past
/// that; a window under it means it never has to, so a request numbered early and committed late
/// (or sent again after a leader change) is never taken for a late duplicate. The margin above
/// coord-proxy's largest batch (8,192 numbered arrivals and its call) lets a batch share a lane.
pub const REQUEST_WINDOW: u64 = 12 * 1024;

/// Hands out request ids for one client and tracks which are in flight.
///
/// The ids run in lanes, each a client id of its own to the ensemble. A request goes in the first
/// lane whose numbers stay within [`REQUEST_WINDOW`] of its oldest request in flight: almost
/// always the first. A request that stays in flight for long (a parked barrier, a GetAliveTasks
/// round of 30,000 tasks each parked on the leader) holds its lane's `acked_below` back, and once
/// the lane's window is full, later requests go in the next lane instead of pushing the ensemble
/// past what it keeps of that client. A lane is used again as soon as its window has room.
pub struct RequestSession {
    client: u64,
    lanes: Mutex<Vec<Lane>>,
}

/// One client id's numbers.
struct Lane {
    client: u64,
    next: u64,
    in_flight: BTreeSet<u64>,
}

impl Lane {
    /// Whether `n` more requests fit in the window (any number fit in a lane with none in flight,
    /// so that batches larger than the window reuse lanes too).
    fn has_room(&self, n: u64) -> bool {
        match self.in_flight.first() {
            None => true,
            Some(&oldest) => (self.next + n).saturating_sub(oldest) <= REQUEST_WINDOW,
        }
    }
}

/// The client id of lane `lane` of the session with client id `client`: lane 0 is `client`
/// itself, the others as unlikely to meet another client's id as a random one (splitmix64's
/// finalizer of the pair).
fn lane_client(client: u64, lane: usize) -> u64 {
    if lane == 0 {
        return client;
    }
    let mut z = client ^ (lane as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) | 1
}

impl RequestSession {
    /// `client` must be unique among the ensemble's clients: pick it at random.
    pub fn new(client: u64) -> Arc<Self> {
        Arc::new(Self {
            client,
            lanes: Mutex::new(Vec::new()),
        })
    }

    /// Starts a request; the returned ticket ends it when dropped (answered or abandoned).
    pub fn begin(self: &Arc<Self>) -> Ticket {
        let (lane, id) = self.take(1);
        Ticket {
            session: self.clone(),
            lane,
            id,
        }
    }

    /// Starts `n` requests under one client id (the numbers of the commands one call carries
    /// several of, and the call's own). More than [`REQUEST_WINDOW`] get a lane of their own, and
    /// the ensemble may then forget the oldest of them once all are recorded.
    pub fn begin_many(self: &Arc<Self>, n: usize) -> Vec<Ticket> {
        let (lane, first) = self.take(n as u64);
        (first.seq..first.seq + n as u64)
            .map(|seq| Ticket {
                session: self.clone(),
                lane,
                id: WireRequestId { seq, ..first },
            })
            .collect()
    }

    /// Numbers `n` requests in the first lane with room for them, opening one if none has: the
    /// lane and the first request's id (the others follow it, with the same `acked_below`).
    fn take(&self, n: u64) -> (usize, WireRequestId) {
        // The numbers are taken and marked in flight under one lock: a request numbered between
        // another's numbering and its marking could otherwise acknowledge it (`acked_below` past
        // it) before it was even sent, and the ensemble would refuse it as a late duplicate.
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        let lane = match lanes.iter().position(|l| l.has_room(n)) {
            Some(i) => i,
            None => {
                let i = lanes.len();
                lanes.push(Lane {
                    client: lane_client(self.client, i),
                    next: 1,
                    in_flight: BTreeSet::new(),
                });
                i
            }
        };
        let l = &mut lanes[lane];
        let seq = l.next;
        l.next += n;
        l.in_flight.extend(seq..seq + n);
        let acked_below = l.in_flight.first().copied().unwrap_or(seq);
        let id = WireRequestId {
            client: l.client,
            seq,
            acked_below,
        };
        (lane, id)
    }

    /// Lanes this session has opened (1 unless requests stayed in flight for a whole window).
    pub fn lanes(&self) -> usize {
        self.lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A request of a [`RequestSession`] in flight; keep it until the request's outcome is known.
pub struct Ticket {
    session: Arc<RequestSession>,
    lane: usize,
    pub id: WireRequestId,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut lanes = self
            .session
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = lanes.get_mut(self.lane) {
            l.in_flight.remove(&self.id.seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request left in flight holds its lane back: once the lane's window is full, requests go
    /// in a second lane (another client id), and the first is used again once it has room. No
    /// ticket ever runs a window or more ahead of its `acked_below`.
    #[test]
    fn a_request_left_in_flight_moves_the_others_to_another_lane() {
        let s = RequestSession::new(7);
        let stuck = s.begin();
        assert_eq!(stuck.id.client, 7);
        for _ in 1..REQUEST_WINDOW {
            let t = s.begin();
            assert_eq!((t.id.client, t.id.acked_below), (7, stuck.id.seq));
        }
        let next = s.begin();
        assert_ne!(next.id.client, 7, "the window of lane 0 is full");
        assert_eq!((next.id.seq, next.id.acked_below), (1, 1));
        assert_eq!(s.lanes(), 2);
        // A batch goes whole in one lane.
        let batch = s.begin_many(100);
        assert!(batch.iter().all(|t| t.id.client == next.id.client));
        assert!(batch.iter().all(|t| t.id.acked_below == next.id.seq));
        assert_eq!(batch[99].id.seq, 101);
        drop((stuck, next, batch));
        let back = s.begin();
        assert_eq!(back.id.client, 7, "lane 0 has room again");
        assert_eq!(back.id.seq, back.id.acked_below);
        // A batch larger than a window takes a lane with nothing in flight, here lane 1.
        let big = s.begin_many(REQUEST_WINDOW as usize + 1);
        assert!(big.iter().all(|t| t.id.client != 7));
        assert_eq!(s.lanes(), 2);
    }

    #[test]
    fn lane_clients_differ() {
        let ids: BTreeSet<u64> = (0..1000).map(|lane| lane_client(12345, lane)).collect();
        assert_eq!(ids.len(), 1000);
        assert_eq!(lane_client(12345, 0), 12345);
    }

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

    /// Requests begun concurrently: none may acknowledge another that is still in flight, nor run
    /// a window ahead of its `acked_below`. Ticket X (`acked_below` a) went out after its `begin`
    /// returned; every ticket of its lane numbered below a must have been done with (its drop
    /// begun) before that. (A thread descheduled while it holds a ticket may push the others to
    /// another lane: each lane is checked on its own.)
    #[test]
    fn concurrent_requests_never_acknowledge_one_in_flight() {
        use std::collections::BTreeMap;
        use std::sync::atomic::{AtomicU64, Ordering};
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
                        seen.push((t.id.client, t.id.seq, t.id.acked_below, went_out, done));
                        drop(t);
                    }
                    seen
                })
            })
            .collect();
        let mut lanes: BTreeMap<u64, Vec<(u64, u64, u64, u64)>> = BTreeMap::new();
        for t in threads {
            for (client, seq, acked_below, went_out, done) in t.join().expect("thread") {
                let lane = lanes.entry(client).or_default();
                lane.push((seq, acked_below, went_out, done));
            }
        }
        assert!(lanes.contains_key(&7));
        for (client, mut all) in lanes {
            all.sort_unstable();
            // latest_done[k]: the latest `done` among tickets numbered 1..=k (numbers are 1..=n).
            let mut latest_done = vec![0; all.len() + 1];
            for (i, t) in all.iter().enumerate() {
                assert_eq!(t.0, i as u64 + 1, "lane {client}: ticket numbers are 1..=n");
                latest_done[i + 1] = latest_done[i].max(t.3);
            }
            for &(seq, acked_below, went_out, _) in &all {
                assert!(
                    (1..=seq).contains(&acked_below) && seq - acked_below < REQUEST_WINDOW,
                    "lane {client}, ticket {seq}: {acked_below}"
                );
                let below = latest_done[(acked_below - 1) as usize];
                assert!(
                    acked_below == 1 || below < went_out,
                    "lane {client}: ticket {seq} acknowledged everything below {acked_below} \
                     while one of those was still in flight"
                );
            }
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

//! Split leases: coord-proxy takes several splits of a DYNAMIC iteration at once from the
//! ensemble (one journal update, one round trip for all of them) and hands them to its host's
//! TensorFlow workers, one per GetSplit.
//!
//! TensorFlow's workers ask for one split per element; a Raft commit per split is what bounds a
//! dispatcher-bound input pipeline. A lease is sized to its host's demand: it starts at one split
//! and doubles each time the last one was used up within half of [`LEASE_WINDOW`], up to the
//! proxy's maximum, and halves when one lasted over twice that. So splits that come fast (a
//! `range`'s elements) are leased by the hundred, one commit for all, while slow ones (a file
//! each, read for seconds) go one at a time and stay spread over every host's workers, as under
//! TensorFlow's own dispatcher; and what a host holds is about a window's worth of its demand.
//! A lease changes nothing a worker can see: every split leased
//! is journaled before it leaves the leader, a lease re-driven after a leader change (same
//! request id) gets the same splits, and the splits of a repetition are handed out in order.
//! What a proxy holds when it dies with its workers is lost, as the splits TensorFlow hands to a
//! worker that dies are (at-most-once); and a worker that moves to a later repetition before
//! this one ended drops what is left of it, as TensorFlow's dispatcher does when it resets its
//! provider.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use coord_proto::coord::dispatcher::dispatcher_client::DispatcherClient;
use coord_proto::coord::dispatcher::TfGetSplitsRequest;
use coord_proto::tensorflow::data::{GetSplitRequest, GetSplitResponse};
use coord_proto::tensorflow::TensorProto;
use tonic::Status;

use super::MESSAGE_LIMIT;
use crate::client::CoordClient;

/// A provider nobody asked about for this long is forgotten (its iteration is long over).
const IDLE: Duration = Duration::from_secs(600);

/// How long a lease should last at its host's rate of GetSplits (see the module's docs).
pub const LEASE_WINDOW: Duration = Duration::from_millis(50);

/// The splits leased from each (iteration, provider).
pub struct SplitLeases {
    /// The most splits a lease takes.
    max_lease: u64,
    providers: Mutex<HashMap<(i64, i64), SharedLease>>,
}

/// One provider's lease, and the signal that a lease taken in the background arrived.
type SharedLease = Arc<Provider>;

struct Provider {
    /// Held by one GetSplit at a time (across its round trip to the leader when it must take a
    /// lease itself).
    leased: tokio::sync::Mutex<Leased>,
    arrived: Notify,
}

/// What is leased of one provider: splits of one repetition, not yet handed out.
struct Leased {
    repetition: i64,
    splits: VecDeque<TensorProto>,
    /// Every repetition below this one is over (the ensemble said end of splits).
    over_below: i64,
    used: Instant,
    /// The size of the last lease taken, and when it was taken.
    size: u64,
    taken: Option<Instant>,
    /// A lease of `repetition` is being taken in the background.
    refilling: bool,
    /// The ensemble has no splits of `repetition` beyond those held.
    drained: bool,
}

impl Leased {
    /// The size of a lease taken `now`.
    fn next_size(&self, now: Instant, max: u64) -> u64 {
        match self.taken {
            Some(taken) => next_lease(self.size, now - taken, max),
            None => 1,
        }
    }

    /// Whether to take the next lease now, in the background, so that the host's workers never
    /// wait on a commit while the splits come fast (leases of a few splits or more, half used).
    fn wants_refill(&self) -> bool {
        !self.refilling
            && !self.drained
            && self.size >= 4
            && (self.splits.len() as u64) <= self.size / 2
    }

    /// Splits of `repetition` that arrived: taken from now on, or an end of splits.
    fn arrived(&mut self, repetition: i64, splits: Vec<TensorProto>) {
        if repetition != self.repetition {
            return; // the workers moved on: this repetition's splits are dropped, as at its end
        }
        if splits.is_empty() {
            self.drained = true;
        }
        self.splits.extend(splits);
    }
}

/// The size of the next lease, after one of `size` splits that lasted `lasted` (from its taking
/// until it ran out), leases being at most `max`.
pub fn next_lease(size: u64, lasted: Duration, max: u64) -> u64 {
    if lasted < LEASE_WINDOW / 2 {
        size.saturating_mul(2).clamp(1, max.max(1))
    } else if lasted > LEASE_WINDOW * 2 {
        (size / 2).clamp(1, max.max(1))
    } else {
        size.clamp(1, max.max(1))
    }
}

impl SplitLeases {
    /// Leases of at most `max_lease` splits (1: every GetSplit goes to the ensemble).
    pub fn new(max_lease: u64) -> Self {
        Self {
            max_lease: max_lease.max(1),
            providers: Mutex::default(),
        }
    }

    fn provider(&self, key: (i64, i64)) -> SharedLease {
        let mut g = self
            .providers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !g.contains_key(&key) {
            // A new provider: forget those idle for long (try_lock: one in use is not idle).
            g.retain(|_, p| {
                let idle = |l: &Leased| !l.refilling && l.used.elapsed() >= IDLE;
                p.leased.try_lock().map_or(true, |l| !idle(&l))
            });
        }
        g.entry(key)
            .or_insert_with(|| {
                Arc::new(Provider {
                    leased: tokio::sync::Mutex::new(Leased {
                        repetition: 0,
                        splits: VecDeque::new(),
                        over_below: 0,
                        used: Instant::now(),
                        size: 0,
                        taken: None,
                        refilling: false,
                        drained: false,
                    }),
                    arrived: Notify::new(),
                })
            })
            .clone()
    }

    /// TensorFlow's GetSplit, answered from the lease, which is renewed before it runs out.
    pub async fn get_split(
        &self,
        client: &CoordClient,
        req: GetSplitRequest,
    ) -> Result<GetSplitResponse, Status> {
        let answer = |split: Option<TensorProto>| GetSplitResponse {
            end_of_splits: split.is_none(),
            split,
        };
        let provider = self.provider((req.iteration_id, req.split_provider_index));
        loop {
            // One GetSplit at a time per provider: those that ask meanwhile wait their turn.
            let mut leased = provider.leased.lock().await;
            leased.used = Instant::now();
            if req.repetition < leased.over_below || req.repetition < leased.repetition {
                return Ok(answer(None));
            }
            if req.repetition > leased.repetition {
                leased.repetition = req.repetition;
                leased.splits.clear();
                (leased.refilling, leased.drained) = (false, false);
            }
            if let Some(split) = leased.splits.pop_front() {
                if leased.wants_refill() {
                    let now = Instant::now();
                    let size = leased.next_size(now, self.max_lease);
                    (leased.size, leased.taken, leased.refilling) = (size, Some(now), true);
                    let (client, provider) = (client.clone(), provider.clone());
                    tokio::spawn(refill_in_background(client, provider, req, size));
                }
                return Ok(answer(Some(split)));
            }
            if leased.drained {
                leased.over_below = leased.over_below.max(req.repetition + 1);
                return Ok(answer(None));
            }
            if leased.refilling {
                // Registered before the lock is let go, so the lease's arrival cannot be missed.
                let arrived = provider.arrived.notified();
                drop(leased);
                arrived.await;
                continue;
            }
            let now = Instant::now();
            let size = leased.next_size(now, self.max_lease);
            let splits = take_lease(client, &req, size).await?;
            (leased.size, leased.taken) = (size, Some(now));
            leased.arrived(req.repetition, splits);
        }
    }
}

/// A lease of `size` splits of the provider `req` asks of, from the ensemble.
async fn take_lease(
    client: &CoordClient,
    req: &GetSplitRequest,
    size: u64,
) -> Result<Vec<TensorProto>, Status> {
    let ask = TfGetSplitsRequest {
        iteration_id: req.iteration_id,
        repetition: req.repetition,
        split_provider_index: req.split_provider_index,
        max_splits: size,
    };
    let got = client
        .forward(ask, true, false, |ch, r| async move {
            DispatcherClient::new(ch)
                .max_decoding_message_size(MESSAGE_LIMIT)
                .max_encoding_message_size(MESSAGE_LIMIT)
                .tf_get_splits(r)
                .await
        })
        .await?;
    Ok(got.splits)
}

/// The next lease, taken while the host's workers use up the last one. If it fails (no replica
/// for the client's whole patience), the GetSplit that finds the lease empty takes one itself.
async fn refill_in_background(
    client: CoordClient,
    provider: SharedLease,
    req: GetSplitRequest,
    size: u64,
) {
    let got = take_lease(&client, &req, size).await;
    let mut leased = provider.leased.lock().await;
    if leased.repetition == req.repetition {
        leased.refilling = false;
    }
    if let Ok(splits) = got {
        leased.arrived(req.repetition, splits);
    }
    drop(leased);
    provider.arrived.notify_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAST: Duration = Duration::from_millis(1);
    const STEADY: Duration = LEASE_WINDOW;
    const SLOW: Duration = Duration::from_secs(2);

    #[test]
    fn a_lease_used_up_fast_doubles_up_to_the_maximum() {
        let mut size = 1;
        let mut sizes = Vec::new();
        for _ in 0..10 {
            size = next_lease(size, FAST, 256);
            sizes.push(size);
        }
        assert_eq!(sizes, [2, 4, 8, 16, 32, 64, 128, 256, 256, 256]);
        assert_eq!(
            next_lease(200, FAST, 256),
            256,
            "doubling is cut at the maximum"
        );
    }

    #[test]
    fn a_lease_that_lasts_the_window_keeps_its_size_and_a_slow_one_halves_to_one() {
        assert_eq!(next_lease(64, STEADY, 256), 64);
        assert_eq!(next_lease(64, LEASE_WINDOW / 2, 256), 64);
        assert_eq!(next_lease(64, LEASE_WINDOW * 2, 256), 64);
        let mut size = 256;
        let mut steps = 0;
        while size > 1 {
            size = next_lease(size, SLOW, 256);
            steps += 1;
        }
        assert_eq!(steps, 8);
        assert_eq!(next_lease(1, SLOW, 256), 1, "never below one split");
    }

    #[test]
    fn a_maximum_of_one_sends_every_getsplit_to_the_ensemble() {
        for lasted in [FAST, STEADY, SLOW] {
            assert_eq!(next_lease(1, lasted, 1), 1);
            assert_eq!(next_lease(0, lasted, 0), 1, "a maximum of 0 counts as 1");
        }
        assert_eq!(
            next_lease(64, STEADY, 16),
            16,
            "a lower maximum cuts a lease at once"
        );
    }
}

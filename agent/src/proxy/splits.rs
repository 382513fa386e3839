//! Split leases: coord-proxy takes several splits of a DYNAMIC iteration at once from the
//! ensemble (one journal update, one round trip for all of them) and hands them to its host's
//! TensorFlow workers, one per GetSplit.
//!
//! TensorFlow's workers ask for one split per element; a Raft commit per split is what bounds a
//! dispatcher-bound input pipeline. A lease changes nothing a worker can see: every split leased
//! is journaled before it leaves the leader, a lease re-driven after a leader change (same
//! request id) gets the same splits, and the splits of a repetition are handed out in order.
//! What a proxy holds when it dies with its workers is lost, as the splits TensorFlow hands to a
//! worker that dies are (at-most-once); and a worker that moves to a later repetition before
//! this one ended drops what is left of it, as TensorFlow's dispatcher does when it resets its
//! provider.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use coord_proto::coord::dispatcher::dispatcher_client::DispatcherClient;
use coord_proto::coord::dispatcher::TfGetSplitsRequest;
use coord_proto::tensorflow::data::{GetSplitRequest, GetSplitResponse};
use coord_proto::tensorflow::TensorProto;
use tonic::Status;

use super::MESSAGE_LIMIT;
use crate::client::CoordClient;

/// A provider nobody asked about for this long is forgotten (its iteration is long over).
const IDLE: Duration = Duration::from_secs(600);

/// The splits leased from each (iteration, provider).
pub struct SplitLeases {
    /// Splits per lease.
    lease: u64,
    providers: Mutex<HashMap<(i64, i64), SharedLease>>,
}

/// One provider's lease, held by one GetSplit at a time (across its round trip to the leader).
type SharedLease = Arc<tokio::sync::Mutex<Leased>>;

/// What is leased of one provider: splits of one repetition, not yet handed out.
struct Leased {
    repetition: i64,
    splits: VecDeque<TensorProto>,
    /// Every repetition below this one is over (the ensemble said end of splits).
    over_below: i64,
    used: Instant,
}

impl SplitLeases {
    pub fn new(lease: u64) -> Self {
        Self {
            lease: lease.max(1),
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
            g.retain(|_, p| p.try_lock().map_or(true, |l| l.used.elapsed() < IDLE));
        }
        g.entry(key)
            .or_insert_with(|| {
                Arc::new(tokio::sync::Mutex::new(Leased {
                    repetition: 0,
                    splits: VecDeque::new(),
                    over_below: 0,
                    used: Instant::now(),
                }))
            })
            .clone()
    }

    /// TensorFlow's GetSplit, answered from the lease, which is renewed when it runs out.
    pub async fn get_split(
        &self,
        client: &CoordClient,
        req: GetSplitRequest,
    ) -> Result<GetSplitResponse, Status> {
        let end = GetSplitResponse {
            split: None,
            end_of_splits: true,
        };
        let provider = self.provider((req.iteration_id, req.split_provider_index));
        // One lease at a time per provider: the workers that ask meanwhile take from it.
        let mut leased = provider.lock().await;
        leased.used = Instant::now();
        if req.repetition < leased.over_below || req.repetition < leased.repetition {
            return Ok(end);
        }
        if req.repetition > leased.repetition {
            leased.repetition = req.repetition;
            leased.splits.clear();
        }
        if let Some(split) = leased.splits.pop_front() {
            return Ok(GetSplitResponse {
                split: Some(split),
                end_of_splits: false,
            });
        }
        let ask = TfGetSplitsRequest {
            iteration_id: req.iteration_id,
            repetition: req.repetition,
            split_provider_index: req.split_provider_index,
            max_splits: self.lease,
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
        leased.splits.extend(got.splits);
        match leased.splits.pop_front() {
            Some(split) => Ok(GetSplitResponse {
                split: Some(split),
                end_of_splits: false,
            }),
            None => {
                leased.over_below = leased.over_below.max(req.repetition + 1);
                Ok(end)
            }
        }
    }
}

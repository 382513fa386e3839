//! Where apply's effects reach the server: the state machine reports every applied batch here,
//! after releasing the state lock, and the hub wakes the parked calls it concerns.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use coord_raft_store::storage::ApplyListener;
use coord_raft_store::types::LogId;
use coord_raft_store::Change;

use crate::parked::{ParkedGets, Wake};

pub struct ApplyHub {
    pub parked: Arc<ParkedGets>,
    /// The last applied log index, for metrics.
    pub applied_index: AtomicU64,
}

impl ApplyHub {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            parked: Arc::new(ParkedGets::default()),
            applied_index: AtomicU64::new(0),
        })
    }
}

impl ApplyListener for ApplyHub {
    fn applied(&self, last: LogId, changes: &[Change]) {
        self.applied_index.store(last.index, Ordering::Relaxed);
        for change in changes {
            if let Change::KvPut { key, value, .. } = change {
                self.parked.wake(key, value);
            }
        }
    }

    fn replaced(&self, last: Option<LogId>) {
        self.applied_index
            .store(last.map_or(0, |l| l.index), Ordering::Relaxed);
        self.parked.wake_all(|| Wake::Recheck);
    }
}

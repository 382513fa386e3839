//! Sending a lone write to the followers while the leader syncs it.
//!
//! openraft 0.9 replicates an entry only after the leader's own sync, so a lone write waits for
//! two syncs one after the other: the leader's, then the followers'. Instead, right after the
//! leader writes a lone entry, it sends the entry to the followers itself (a *pre-append*), and
//! syncs while they do. A follower writes the entries only if they extend its log exactly as an
//! AppendEntries of the leader it follows would (same vote, its log ends where they begin) and
//! syncs them. When openraft's own AppendEntries brings the same entries, the follower's log
//! already holds them, durable, and it answers at once.
//!
//! Nothing about commitment changes: a follower acknowledges entries only through openraft,
//! after they are durable, and the leader counts itself only after its own sync. A follower
//! whose log holds pre-appended entries its Raft core has not seen yet is in the state of one
//! that received the leader's AppendEntries but has not answered it; if another leader's entries
//! come instead, they replace them (see `LogEngine::append`), as they would replace any uncommitted
//! entry.

use serde::{Deserialize, Serialize};

use crate::types::{LogId, Vote};

/// Entries the leader has just written, encoded as in the log.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct PreAppend {
    /// The leader's vote: a follower that follows another takes nothing.
    pub vote: Vote,
    /// The log id just before the entries.
    pub prev: Option<LogId>,
    pub entries: Vec<(LogId, Vec<u8>)>,
}

/// Entries larger than this together go the usual way only: a pre-append is written to the
/// socket in one go or not at all.
pub const MAX_PRE_APPEND_BYTES: usize = 64 << 10;

/// Where a leader's pre-appends go: the replica's Raft transport, which sends them to the
/// followers without waiting for answers.
pub trait PreAppendSink: Send + Sync + 'static {
    /// Sends `msg` on its way; returns to how many followers.
    fn send(&self, msg: PreAppend) -> usize;
}

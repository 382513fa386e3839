//! Client sessions: the memory that makes retried mutations apply once.
//!
//! For each client the table keeps the results of requests the client has not yet acknowledged. A
//! retry of such a request gets the stored result; a request older than the client's
//! acknowledgement watermark is a late duplicate and is refused. Idle sessions expire after
//! [`SESSION_IDLE_TTL_MS`] of *proposal* time, so expiry is deterministic like everything else in
//! apply.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::command::CommandResult;
use crate::error::{OpError, RequestId};

/// A session with no request for this long (by the leader's proposal clock) is forgotten.
pub const SESSION_IDLE_TTL_MS: u64 = 60 * 60 * 1000;
/// Expired sessions are looked for at most this often.
const SWEEP_INTERVAL_MS: u64 = 60 * 1000;
/// A client that never acknowledges cannot make the table grow without bound. Past this the
/// oldest results are forgotten, and their requests, if they come again, refused as late
/// duplicates: coord's clients keep their requests within a window under it
/// (`coord_proto::metadata::REQUEST_WINDOW`). A deterministic part of apply: every replica must
/// agree on it.
pub const MAX_RESULTS_PER_SESSION: usize = 16 * 1024;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionTable {
    sessions: BTreeMap<u64, Session>,
    last_sweep_ms: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
struct Session {
    /// Every request below this sequence number has been answered and forgotten.
    acked_below: u64,
    /// Results of applied requests at or above `acked_below`.
    results: BTreeMap<u64, CommandResult>,
    last_seen_ms: u64,
}

impl SessionTable {
    /// Returns the answer for a request that must not be applied again, or `None` if it is new.
    pub(crate) fn replay(&mut self, req: &RequestId, now_ms: u64) -> Option<CommandResult> {
        let session = self.sessions.entry(req.client).or_default();
        session.last_seen_ms = session.last_seen_ms.max(now_ms);
        if req.seq < session.acked_below {
            return Some(Err(OpError::StaleDuplicate { request: *req }));
        }
        session.results.get(&req.seq).cloned()
    }

    /// Remembers the result of a newly applied request and forgets what the client acknowledged.
    pub(crate) fn record(&mut self, req: &RequestId, result: &CommandResult) {
        let session = self.sessions.entry(req.client).or_default();
        session.results.insert(req.seq, result.clone());
        if req.acked_below > session.acked_below {
            session.acked_below = req.acked_below;
            session.results = session.results.split_off(&req.acked_below);
        }
        while session.results.len() > MAX_RESULTS_PER_SESSION {
            if let Some((&oldest, _)) = session.results.iter().next() {
                session.results.remove(&oldest);
                session.acked_below = session.acked_below.max(oldest + 1);
            }
        }
    }

    /// Drops sessions idle for longer than [`SESSION_IDLE_TTL_MS`].
    pub(crate) fn expire(&mut self, now_ms: u64) {
        if now_ms < self.last_sweep_ms.saturating_add(SWEEP_INTERVAL_MS) {
            return;
        }
        self.last_sweep_ms = now_ms;
        self.sessions
            .retain(|_, s| s.last_seen_ms.saturating_add(SESSION_IDLE_TTL_MS) > now_ms);
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Output;

    fn rid(client: u64, seq: u64, acked_below: u64) -> RequestId {
        RequestId {
            client,
            seq,
            acked_below,
        }
    }

    #[test]
    fn retry_gets_first_result_and_late_duplicate_is_refused() {
        let mut t = SessionTable::default();
        let r1 = rid(7, 1, 1);
        assert_eq!(t.replay(&r1, 0), None);
        t.record(&r1, &Ok(Output::Done));
        assert_eq!(t.replay(&r1, 0), Some(Ok(Output::Done)));
        // Request 2 acknowledges everything below 2, so 1 is forgotten.
        let r2 = rid(7, 2, 2);
        assert_eq!(t.replay(&r2, 0), None);
        t.record(&r2, &Ok(Output::Deleted(3)));
        assert!(matches!(
            t.replay(&r1, 0),
            Some(Err(OpError::StaleDuplicate { .. }))
        ));
        assert_eq!(t.replay(&r2, 0), Some(Ok(Output::Deleted(3))));
    }

    #[test]
    fn concurrent_requests_of_one_client_are_kept_apart() {
        let mut t = SessionTable::default();
        for seq in 1..=3 {
            t.record(&rid(1, seq, 1), &Ok(Output::Deleted(seq)));
        }
        for seq in 1..=3 {
            assert_eq!(t.replay(&rid(1, seq, 1), 0), Some(Ok(Output::Deleted(seq))));
        }
        assert_eq!(
            t.replay(&rid(2, 1, 1), 0),
            None,
            "other clients are separate"
        );
    }

    #[test]
    fn idle_sessions_expire_by_proposal_time() {
        let mut t = SessionTable::default();
        t.replay(&rid(1, 1, 1), 1_000);
        t.replay(&rid(2, 1, 1), SESSION_IDLE_TTL_MS);
        t.expire(SESSION_IDLE_TTL_MS + 1_000);
        assert_eq!(t.len(), 1);
    }
}

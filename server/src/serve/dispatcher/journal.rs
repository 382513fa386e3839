//! The dispatcher's journal, read back from the Raft log: one line per dispatcher update (from
//! either surface: TensorFlow's RPCs read `tfdata.<rpc>`), with the entry's index, term and the
//! leader's clock. Entries compacted into a snapshot are gone from the log (the snapshot holds
//! their effect), so the journal starts at the first entry kept. It is the current namespace's
//! journal: updates of other namespaces' dispatchers are left out.

use coord_proto::coord::dispatcher as pb;
use coord_raft_store::storage::LogStore;
use coord_raft_store::Op;
use openraft::storage::RaftLogStorage;
use openraft::{EntryPayload, RaftLogReader};

use crate::error::CoordError;
use crate::serve::namespace;

/// At most this many entries per call.
const MAX_ENTRIES: u64 = 10_000;

pub async fn read(
    log: &LogStore,
    req: &pb::JournalRequest,
) -> Result<pb::JournalResponse, CoordError> {
    let mut log = log.clone();
    let state = log
        .get_log_state()
        .await
        .map_err(|e| CoordError::Internal(format!("cannot read the log state: {e}")))?;
    let first = state.last_purged_log_id.map_or(1, |l| l.index + 1);
    let last = state.last_log_id.map_or(0, |l| l.index);
    let limit = if req.limit == 0 {
        1_000
    } else {
        req.limit.min(MAX_ENTRIES)
    };
    let mut at = req.from_index.max(first);
    let ns = namespace::current();
    let mut entries = Vec::new();
    // Read in chunks: most entries may be other commands.
    while at <= last && (entries.len() as u64) < limit {
        let end = (at + 1_000).min(last + 1);
        let chunk = log.try_get_log_entries(at..end).await.map_err(|e| {
            CoordError::Internal(format!("cannot read log entries {at}..{end}: {e}"))
        })?;
        for e in chunk {
            let EntryPayload::Normal(p) = &e.payload else {
                continue;
            };
            for c in &p.commands {
                let op = match (&c.op, &ns) {
                    (Op::InNamespace { namespace, op }, Some(name)) if **name == **namespace => {
                        &**op
                    }
                    (Op::InNamespace { .. }, _) => continue,
                    (op, None) => op,
                    (_, Some(_)) => continue,
                };
                let update = match op {
                    Op::Dispatcher(op) => op.to_string(),
                    Op::LegacyDispatch(op) => op.to_string(),
                    _ => continue,
                };
                entries.push(pb::JournalEntry {
                    index: e.log_id.index,
                    term: e.log_id.leader_id.term,
                    proposed_at_ms: p.proposed_at_ms,
                    update,
                });
            }
        }
        at = end;
    }
    entries.truncate(limit as usize);
    Ok(pb::JournalResponse {
        entries,
        first_index: first,
    })
}

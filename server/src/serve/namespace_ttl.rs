//! Namespaces past their TTL, deleted by whichever replica leads: a namespace whose `ttl_ms` ran
//! out with no task connected, no command, and no call parked on this leader is proposed for
//! expiry. Apply deletes it only if it is still idle since the time the leader saw (a command in
//! between keeps it), so a late or repeated proposal is harmless, and a new leader judges again
//! from the replicated last-command time.

use std::sync::Arc;
use std::time::Duration;

use coord_raft_store::storage::StateReader;
use coord_raft_store::Op;

use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::apply_hub::ApplyHub;
use crate::serve::proposer::{now_ms, Proposer};

/// How often the leader looks.
const EVERY: Duration = Duration::from_secs(1);

pub async fn run(leader: LeaderWatch, reader: StateReader, proposer: Proposer, hub: Arc<ApplyHub>) {
    loop {
        tokio::time::sleep(EVERY).await;
        if leader.current() != Leadership::Me {
            continue;
        }
        let now = now_ms();
        let due: Vec<(String, u64)> = reader.read(|a| {
            a.state
                .namespaces
                .iter()
                .filter(|(_, n)| n.expired_at(now))
                .map(|(name, n)| (name.clone(), n.last_active_ms))
                .collect()
        });
        for (namespace, idle_since_ms) in due {
            if hub.budget.used_in(&Some(namespace.as_str().into())) > 0 {
                continue;
            }
            tracing::info!(
                namespace = namespace.as_str(),
                idle_ms = now.saturating_sub(idle_since_ms),
                "namespace idle past its TTL; deleting it"
            );
            proposer.propose_decision(Op::ExpireNamespace {
                namespace,
                idle_since_ms,
            });
        }
    }
}

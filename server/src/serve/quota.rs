//! Putting the leader's `--quota-bytes` in force: the quota is part of the replicated state (so
//! every replica refuses the same writes, see `coord_raft_store::state::Quota`), and whichever
//! replica leads proposes its own flag when the state holds another value. Replicas should be
//! given the same flag; when they differ, the current leader's is in force.

use std::time::Duration;

use coord_raft_store::storage::StateReader;
use coord_raft_store::{Command, Op};

use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::proposer::Proposer;

/// How often a leader compares the replicated quota with its flag.
const CHECK_EVERY: Duration = Duration::from_millis(200);

pub async fn run(bytes: u64, leader: LeaderWatch, reader: StateReader, proposer: Proposer) {
    loop {
        let replicated = reader.read(|a| a.state.quota.bytes);
        if replicated != bytes && leader.current() == Leadership::Me {
            let op = Op::SetQuota { bytes };
            match proposer.propose(Command { request: None, op }).await {
                Ok(_) => {
                    tracing::info!(
                        quota_bytes = bytes,
                        previous = replicated,
                        "memory quota set"
                    );
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not set the memory quota yet; retrying")
                }
            }
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

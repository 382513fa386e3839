//! Setting the cluster up: the first leader proposes the configuration from its flags and a
//! random service incarnation. Once committed, the configuration and incarnation are the same on
//! every replica forever; a replica started with different flags says so loudly and follows the
//! replicated configuration.

use std::time::Duration;

use coord_raft_store::state::ClusterConfig;
use coord_raft_store::storage::StateReader;
use coord_raft_store::{Command, Op};

use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::proposer::Proposer;

pub async fn run(
    config: ClusterConfig,
    leader: LeaderWatch,
    reader: StateReader,
    proposer: Proposer,
) {
    let mut warned = false;
    loop {
        let replicated = reader.read(|a| {
            a.state
                .cluster
                .as_ref()
                .map(|c| (c.config.clone(), c.service_incarnation))
        });
        match replicated {
            Some((replicated, incarnation)) => {
                if replicated != config && !warned {
                    tracing::error!(
                        flags = ?config,
                        replicated = ?replicated,
                        "this replica's cluster flags differ from the cluster configuration the ensemble \
                         agreed on; the replicated one is in force (restart it with matching flags)"
                    );
                    warned = true;
                } else if !warned {
                    tracing::info!(
                        service_incarnation = format!("{incarnation:#x}"),
                        tasks = config.task_count(),
                        "cluster configuration in force"
                    );
                    warned = true;
                }
            }
            None if leader.current() == Leadership::Me => {
                let op = Op::InitCluster {
                    config: config.clone(),
                    service_incarnation: rand::random::<u64>() | 1,
                };
                match proposer.propose(Command { request: None, op }).await {
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not set the cluster up yet; retrying")
                    }
                }
            }
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(if warned { 5_000 } else { 50 })).await;
    }
}

//! Shared pieces of the raft-store tests: a store in a temp dir, a network for one-node Rafts,
//! and the macros that run a test once per log engine.

#![allow(dead_code, unused_macros)]

/// One `#[test]` per log engine for each `fn name(engine: RaftLogEngine)` named, in modules
/// `segments` and `sled`.
macro_rules! for_each_engine {
    ($($test:ident),* $(,)?) => {
        mod segments {
            $(#[test] fn $test() { super::$test(coord_raft_store::storage::RaftLogEngine::Segments) })*
        }
        mod sled {
            $(#[test] fn $test() { super::$test(coord_raft_store::storage::RaftLogEngine::Sled) })*
        }
    };
}

/// [`for_each_engine`] for `async fn name(engine: RaftLogEngine)`, each on a two-thread runtime.
macro_rules! for_each_engine_async {
    ($($test:ident),* $(,)?) => {
        mod segments {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(coord_raft_store::storage::RaftLogEngine::Segments).await
                }
            )*
        }
        mod sled {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(coord_raft_store::storage::RaftLogEngine::Sled).await
                }
            )*
        }
    };
}

use std::sync::Arc;

use coord_raft_store::storage::{self, ApplyListener, LogStore, StateMachineStore, StoreOptions};
use coord_raft_store::types::{LogId, NodeId, TypeConfig};
use coord_raft_store::Change;
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;

pub struct NoListener;

impl ApplyListener for NoListener {
    fn applied(&self, _last: LogId, _changes: &[Change]) {}
    fn replaced(&self, _last: Option<LogId>) {}
}

pub fn open_store(dir: &std::path::Path, options: StoreOptions) -> (LogStore, StateMachineStore) {
    let o = storage::open(dir, options, Arc::new(NoListener)).expect("open store");
    (o.log, o.state_machine)
}

/// A one-replica Raft never sends anything; any attempt is an error the test would see.
pub struct NoPeers;

#[derive(Debug, thiserror::Error)]
#[error("a one-replica cluster has no peers")]
pub struct NoPeersError;

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeers;
    async fn new_client(&mut self, _target: NodeId, _node: &BasicNode) -> Self::Network {
        NoPeers
    }
}

impl RaftNetwork<TypeConfig> for NoPeers {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(RPCError::Unreachable(Unreachable::new(&NoPeersError)))
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(RPCError::Unreachable(Unreachable::new(&NoPeersError)))
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        Err(RPCError::Unreachable(Unreachable::new(&NoPeersError)))
    }
}

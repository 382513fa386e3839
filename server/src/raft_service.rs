//! The receiving side of the Raft transport: decodes openraft messages and hands them to the local
//! Raft node. Traffic stamped with another ensemble's cluster id is refused.

use std::sync::Arc;

use coord_proto::coord::raft::raft_transport_server::RaftTransport;
use coord_proto::coord::raft::{RaftReply, RaftRequest};
use coord_raft_store::codec;
use coord_raft_store::types::Raft;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::election::LeaderContact;

pub struct RaftService {
    raft: Raft,
    cluster_id: u64,
    /// Every AppendEntries is a sign of life from a leader (see `election`).
    contact: Arc<LeaderContact>,
}

impl RaftService {
    pub fn new(raft: Raft, cluster_id: u64, contact: Arc<LeaderContact>) -> Self {
        Self {
            raft,
            cluster_id,
            contact,
        }
    }

    fn decode<T: DeserializeOwned>(&self, req: Request<RaftRequest>) -> Result<T, Status> {
        let req = req.into_inner();
        if req.cluster_id != self.cluster_id {
            return Err(Status::permission_denied(format!(
                "Raft message from ensemble {:016x}; this replica belongs to ensemble {:016x}",
                req.cluster_id, self.cluster_id
            )));
        }
        codec::decode("raft request", &req.payload)
            .map_err(|e| Status::invalid_argument(e.to_string()))
    }
}

fn reply<T: Serialize>(result: &T) -> Result<Response<RaftReply>, Status> {
    let payload =
        codec::encode("raft reply", result).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftReply {
        payload: payload.into(),
    }))
}

#[tonic::async_trait]
impl RaftTransport for RaftService {
    async fn append_entries(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc = self.decode(req)?;
        self.contact.touch();
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, req: Request<RaftRequest>) -> Result<Response<RaftReply>, Status> {
        let rpc = self.decode(req)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        req: Request<RaftRequest>,
    ) -> Result<Response<RaftReply>, Status> {
        let rpc = self.decode(req)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }
}

//! [`DispatchClient`]: the dispatcher's calls over a [`CoordClient`], so they follow the leader and
//! retry with the same request id (a retried GetSplit gets the split it was first given).

use crate::client::Channel;
use coord_proto::coord::dispatcher as pb;
use coord_proto::coord::dispatcher::dispatcher_client::DispatcherClient;
use tonic::Status;

use crate::CoordClient;

#[derive(Clone)]
pub struct DispatchClient {
    coord: CoordClient,
}

fn stub(ch: Channel) -> DispatcherClient<Channel> {
    DispatcherClient::new(ch)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// Defines a method that sends one dispatcher RPC with failover; `mutation` calls get a request id.
macro_rules! call {
    ($(#[$doc:meta])* $name:ident, $req:ty, $resp:ty, $mutation:expr) => {
        $(#[$doc])*
        pub async fn $name(&self, req: $req) -> Result<$resp, Status> {
            self.coord
                .forward(req, $mutation, false, |ch, r| async move { stub(ch).$name(r).await })
                .await
        }
    };
}

impl DispatchClient {
    pub fn new(coord: CoordClient) -> Self {
        Self { coord }
    }

    pub fn coord(&self) -> &CoordClient {
        &self.coord
    }

    call!(
        /// Registers a dataset definition, or finds the one with the same fingerprint.
        get_or_register_dataset, pb::GetOrRegisterDatasetRequest, pb::GetOrRegisterDatasetResponse, true);
    call!(
        get_dataset_def,
        pb::GetDatasetDefRequest,
        pb::GetDatasetDefResponse,
        false
    );
    call!(
        /// Creates a job, or joins the named one; returns the job and a client id.
        get_or_create_job, pb::GetOrCreateJobRequest, pb::GetOrCreateJobResponse, true);
    call!(
        release_job_client,
        pb::ReleaseJobClientRequest,
        pb::ReleaseJobClientResponse,
        true
    );
    call!(
        client_heartbeat,
        pb::ClientHeartbeatRequest,
        pb::ClientHeartbeatResponse,
        true
    );
    call!(
        worker_heartbeat,
        pb::WorkerHeartbeatRequest,
        pb::WorkerHeartbeatResponse,
        true
    );
    call!(
        worker_update,
        pb::WorkerUpdateRequest,
        pb::WorkerUpdateResponse,
        true
    );
    call!(get_split, pb::GetSplitRequest, pb::GetSplitResponse, true);
    call!(
        get_workers,
        pb::GetWorkersRequest,
        pb::GetWorkersResponse,
        false
    );
    call!(list_jobs, pb::ListJobsRequest, pb::ListJobsResponse, false);
    call!(journal, pb::JournalRequest, pb::JournalResponse, false);
}

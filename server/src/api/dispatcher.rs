//! `coord.dispatcher.Dispatcher`: every call runs on the leader (a follower forwards it); updates
//! carry the client's request id, so a retry after a leader change applies once (a GetSplit
//! retried gets the split it was first given, never a second one). Its operator views (jobs,
//! workers, journal) show the whole dispatcher, TensorFlow's iterations and workers included.

use std::sync::Arc;

use coord_proto::coord::dispatcher as pb;
use coord_proto::coord::dispatcher::dispatcher_client::DispatcherClient;
use coord_proto::coord::dispatcher::dispatcher_server::Dispatcher;
use coord_raft_store::storage::LogStore;
use tonic::{Request, Response, Status};

use crate::raft::peers::PeerChannel;
use crate::serve::dispatcher::DispatcherCore;
use crate::serve::route::{Kind, Router};

/// The most splits of TensorFlow's dispatcher one lease takes.
const MAX_SPLITS_PER_LEASE: u64 = 1024;

pub struct DispatcherService {
    router: Arc<Router>,
    core: Arc<DispatcherCore>,
    log: LogStore,
}

impl DispatcherService {
    pub fn new(router: Arc<Router>, core: Arc<DispatcherCore>, log: LogStore) -> Self {
        Self { router, core, log }
    }
}

fn client(ch: PeerChannel) -> DispatcherClient<PeerChannel> {
    DispatcherClient::new(ch)
        .max_decoding_message_size(crate::raft::peers::PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(crate::raft::peers::PEER_MESSAGE_LIMIT)
}

#[tonic::async_trait]
impl Dispatcher for DispatcherService {
    async fn get_or_register_dataset(
        &self,
        req: Request<pb::GetOrRegisterDatasetRequest>,
    ) -> Result<Response<pb::GetOrRegisterDatasetResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/GetOrRegisterDataset",
            Kind::Write,
            get_or_register_dataset,
            |core, m, id| core.register_definition(id, m.dataset).await
        )
    }

    async fn get_dataset_def(
        &self,
        req: Request<pb::GetDatasetDefRequest>,
    ) -> Result<Response<pb::GetDatasetDefResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/GetDatasetDef",
            Kind::Read,
            get_dataset_def,
            |core, m, _| Ok(pb::GetDatasetDefResponse {
                dataset: Some(core.definition(m.dataset_id).await?),
            })
        )
    }

    async fn get_or_create_job(
        &self,
        req: Request<pb::GetOrCreateJobRequest>,
    ) -> Result<Response<pb::GetOrCreateJobResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/GetOrCreateJob",
            Kind::Write,
            get_or_create_job,
            |core, m, id| core.join_job(id, m).await
        )
    }

    async fn release_job_client(
        &self,
        req: Request<pb::ReleaseJobClientRequest>,
    ) -> Result<Response<pb::ReleaseJobClientResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/ReleaseJobClient",
            Kind::Write,
            release_job_client,
            |core, m, id| {
                core.release_job_client(id, m.client_id).await?;
                Ok(pb::ReleaseJobClientResponse {})
            }
        )
    }

    async fn client_heartbeat(
        &self,
        req: Request<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/ClientHeartbeat",
            Kind::Write,
            client_heartbeat,
            |core, m, id| core.job_client_heartbeat(id, m).await
        )
    }

    async fn worker_heartbeat(
        &self,
        req: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/WorkerHeartbeat",
            Kind::Write,
            worker_heartbeat,
            |core, m, id| core.data_worker_heartbeat(id, m).await
        )
    }

    async fn worker_update(
        &self,
        req: Request<pb::WorkerUpdateRequest>,
    ) -> Result<Response<pb::WorkerUpdateResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/WorkerUpdate",
            Kind::Write,
            worker_update,
            |core, m, id| {
                core.report_delivery(id, m).await?;
                Ok(pb::WorkerUpdateResponse {})
            }
        )
    }

    async fn get_split(
        &self,
        req: Request<pb::GetSplitRequest>,
    ) -> Result<Response<pb::GetSplitResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/GetSplit",
            Kind::Write,
            get_split,
            |core, m, id| core.lease_splits(id, m).await
        )
    }

    async fn get_workers(
        &self,
        req: Request<pb::GetWorkersRequest>,
    ) -> Result<Response<pb::GetWorkersResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/GetWorkers",
            Kind::Read,
            get_workers,
            |core, _, _| core.worker_rows().await
        )
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        routed!(
            self,
            req,
            "dispatcher/ListJobs",
            Kind::Read,
            list_jobs,
            |core, _, _| core.job_rows().await
        )
    }

    async fn journal(
        &self,
        req: Request<pb::JournalRequest>,
    ) -> Result<Response<pb::JournalResponse>, Status> {
        let log = &self.log;
        self.router
            .route(
                "dispatcher/Journal",
                Kind::Read,
                req,
                |m, _| async move { crate::serve::dispatcher::journal::read(log, &m).await },
                |ch, r| async move { client(ch).journal(r).await },
            )
            .await
    }

    async fn tf_get_splits(
        &self,
        req: Request<pb::TfGetSplitsRequest>,
    ) -> Result<Response<pb::TfGetSplitsResponse>, Status> {
        // TF's GetSplit, leased by coord-proxy: held through elections as TF's are.
        routed!(
            self,
            req,
            "tfdata/GetSplits",
            Kind::Write,
            tf_get_splits,
            |core, m, id| {
                let at = crate::serve::dispatcher::tf::splits::SplitRequest {
                    iteration: m.iteration_id,
                    repetition: m.repetition,
                    provider: m.split_provider_index,
                };
                let max = m.max_splits.clamp(1, MAX_SPLITS_PER_LEASE);
                Ok(pb::TfGetSplitsResponse {
                    splits: core.get_splits(id, at, max).await?,
                })
            }
        )
    }
}

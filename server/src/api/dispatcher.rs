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
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/GetOrRegisterDataset",
                Kind::Write,
                req,
                |m, id| core.register_definition(id, m.dataset),
                |ch, r| async move { client(ch).get_or_register_dataset(r).await },
            )
            .await
    }

    async fn get_dataset_def(
        &self,
        req: Request<pb::GetDatasetDefRequest>,
    ) -> Result<Response<pb::GetDatasetDefResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/GetDatasetDef",
                Kind::Read,
                req,
                |m, _| async move {
                    Ok(pb::GetDatasetDefResponse {
                        dataset: Some(core.definition(m.dataset_id).await?),
                    })
                },
                |ch, r| async move { client(ch).get_dataset_def(r).await },
            )
            .await
    }

    async fn get_or_create_job(
        &self,
        req: Request<pb::GetOrCreateJobRequest>,
    ) -> Result<Response<pb::GetOrCreateJobResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/GetOrCreateJob",
                Kind::Write,
                req,
                |m, id| core.join_job(id, m),
                |ch, r| async move { client(ch).get_or_create_job(r).await },
            )
            .await
    }

    async fn release_job_client(
        &self,
        req: Request<pb::ReleaseJobClientRequest>,
    ) -> Result<Response<pb::ReleaseJobClientResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/ReleaseJobClient",
                Kind::Write,
                req,
                |m, id| async move {
                    core.release_job_client(id, m.client_id).await?;
                    Ok(pb::ReleaseJobClientResponse {})
                },
                |ch, r| async move { client(ch).release_job_client(r).await },
            )
            .await
    }

    async fn client_heartbeat(
        &self,
        req: Request<pb::ClientHeartbeatRequest>,
    ) -> Result<Response<pb::ClientHeartbeatResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/ClientHeartbeat",
                Kind::Write,
                req,
                |m, id| core.job_client_heartbeat(id, m),
                |ch, r| async move { client(ch).client_heartbeat(r).await },
            )
            .await
    }

    async fn worker_heartbeat(
        &self,
        req: Request<pb::WorkerHeartbeatRequest>,
    ) -> Result<Response<pb::WorkerHeartbeatResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/WorkerHeartbeat",
                Kind::Write,
                req,
                |m, id| core.data_worker_heartbeat(id, m),
                |ch, r| async move { client(ch).worker_heartbeat(r).await },
            )
            .await
    }

    async fn worker_update(
        &self,
        req: Request<pb::WorkerUpdateRequest>,
    ) -> Result<Response<pb::WorkerUpdateResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/WorkerUpdate",
                Kind::Write,
                req,
                |m, id| async move {
                    core.report_delivery(id, m).await?;
                    Ok(pb::WorkerUpdateResponse {})
                },
                |ch, r| async move { client(ch).worker_update(r).await },
            )
            .await
    }

    async fn get_split(
        &self,
        req: Request<pb::GetSplitRequest>,
    ) -> Result<Response<pb::GetSplitResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/GetSplit",
                Kind::Write,
                req,
                |m, id| core.lease_splits(id, m),
                |ch, r| async move { client(ch).get_split(r).await },
            )
            .await
    }

    async fn get_workers(
        &self,
        req: Request<pb::GetWorkersRequest>,
    ) -> Result<Response<pb::GetWorkersResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/GetWorkers",
                Kind::Read,
                req,
                |_, _| core.worker_rows(),
                |ch, r| async move { client(ch).get_workers(r).await },
            )
            .await
    }

    async fn list_jobs(
        &self,
        req: Request<pb::ListJobsRequest>,
    ) -> Result<Response<pb::ListJobsResponse>, Status> {
        let core = &*self.core;
        self.router
            .route(
                "dispatcher/ListJobs",
                Kind::Read,
                req,
                |_, _| core.job_rows(),
                |ch, r| async move { client(ch).list_jobs(r).await },
            )
            .await
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
        let core = &*self.core;
        self.router
            .route(
                // TF's GetSplit, leased by coord-proxy: held through elections as TF's are.
                "tfdata/GetSplits",
                Kind::Write,
                req,
                |m, id| async move {
                    let at = crate::serve::dispatcher::tf::splits::SplitRequest {
                        iteration: m.iteration_id,
                        repetition: m.repetition,
                        provider: m.split_provider_index,
                    };
                    Ok(pb::TfGetSplitsResponse {
                        splits: core
                            .get_splits(id, at, m.max_splits.clamp(1, MAX_SPLITS_PER_LEASE))
                            .await?,
                    })
                },
                |ch, r| async move { client(ch).tf_get_splits(r).await },
            )
            .await
    }
}

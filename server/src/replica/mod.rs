//! Wiring of one replica: storage, Raft node, leader-side machinery, gRPC and HTTP servers, and
//! the order in which they start and stop.
//!
//! Start order: bind both ports (fail fast if taken) → open storage → check the data directory's
//! identity → start Raft → serve → bootstrap a pristine ensemble. Stop: stop serving, stop Raft,
//! drop the background tasks.

use std::sync::Arc;

use coord_proto::coord::admin::admin_server::AdminServer;
use coord_proto::coord::admin::namespaces_server::NamespacesServer;
use coord_proto::coord::coordination::coordination_server::CoordinationServer;
use coord_proto::coord::dispatcher::dispatcher_server::DispatcherServer;
use coord_proto::coord::kv::key_value_server::KeyValueServer;
use coord_proto::coord::raft::raft_transport_server::RaftTransportServer;
use coord_proto::tensorflow::coordination_service_server::CoordinationServiceServer;
use coord_raft_store::stats::SyncStats;
use coord_raft_store::storage::{self, LogStore, StoreOptions};
use coord_raft_store::types::Raft;
use openraft::BasicNode;
use tokio::net::TcpListener;
use tonic::codec::CompressionEncoding;

use crate::api::admin::AdminService;
use crate::api::coordination::CoordService;
use crate::api::namespaces::NamespacesService;
use crate::ops::config::Args;
use crate::ops::identity;
use crate::ops::metrics::Metrics;
use crate::raft::leader::LeaderWatch;
use crate::raft::network::Network;
use crate::raft::peers::{PeerChannels, PEER_MESSAGE_LIMIT};
use crate::raft::service::RaftService;
use crate::serve::apply_hub::ApplyHub;
use crate::serve::kv::{KvCore, Limits};
use crate::serve::namespace::NsReader;
use crate::serve::proposer::Proposer;
use crate::serve::read_index::ReadIndex;
use crate::serve::route::Router;
use crate::tasks::TaskGuard;

mod start;
use crate::api::tf::TfService;
use crate::api::xla::XlaService;
use crate::ops::status;
use coord_proto::xla::coordination::coordination_service_server::CoordinationServiceServer as XlaServer;
pub use start::{bind, StartError};
use start::{log_at_start, raft_config, watch_leadership};

/// How long a stopping replica lets connected clients finish before it closes their connections.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Everything a running replica is made of.
pub struct Replica {
    pub args: Args,
    pub raft: Raft,
    pub router: Arc<Router>,
    pub kv: Arc<KvCore>,
    pub coord: Arc<crate::serve::coordination::CoordCore>,
    /// The tf.data dispatcher, behind both of its surfaces.
    pub dispatcher: Arc<crate::serve::dispatcher::DispatcherCore>,
    /// The Raft log, read back for the dispatcher's journal.
    log: LogStore,
    pub leader: LeaderWatch,
    pub hub: Arc<ApplyHub>,
    pub metrics: Arc<Metrics>,
    pub sync_stats: Arc<SyncStats>,
    /// What the AppendEntries links of this replica's replication streams did (`raft_link`).
    pub link_stats: Arc<crate::raft::link::LinkStats>,
    pub cluster_id: u64,
    contact: Arc<crate::raft::election::LeaderContact>,
    /// The log and vote were empty at start: this replica bootstraps the ensemble.
    pristine: bool,
    /// Owns the background loops; they stop when the replica is dropped.
    _tasks: TaskGuard,
    /// This process's lock on the data directory, held for the replica's life.
    _data_lock: crate::ops::data_lock::DataLock,
    /// The runtime the Raft core runs on (see `open`); shut down after Raft stops.
    raft_runtime: std::sync::Mutex<Option<tokio::runtime::Runtime>>,
    /// The gRPC port's TLS (`--tls-*`); `None` serves plain gRPC.
    server_tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// How this replica connects to its peers over TLS.
    peer_tls: Option<coord_proto::tls::ClientTls>,
    /// The TLS of its Raft links and pre-appends, both ways.
    link_tls: Option<Arc<crate::raft::link_tls::LinkTls>>,
}

impl Replica {
    /// Opens the data directory, which `data_lock` holds for this process, and starts the Raft
    /// node (not yet serving).
    pub async fn open(
        args: Args,
        data_lock: crate::ops::data_lock::DataLock,
    ) -> Result<Self, StartError> {
        args.validate().map_err(StartError::Config)?;
        let tls = crate::ops::tls::from_args(&args).map_err(StartError::Tls)?;
        let authz = crate::ops::authz::Authz::new(tls.is_some(), &args.cluster_token);
        let (server_tls, peer_tls, served_cert, link_tls) = match tls {
            Some(t) => (Some(t.server), Some(t.client), Some(t.served), Some(t.link)),
            None => (None, None, None, None),
        };
        // Restored from a backup: now (--restore), or when the data directory was made.
        let restored_from = match &args.restore {
            Some(path) => {
                Some(crate::ops::restore::prepare(&args, path).map_err(StartError::Config)?)
            }
            None => identity::recorded_restore(&args)?,
        };
        let cluster_id = identity::cluster_id(&args, restored_from);
        let hub = ApplyHub::new(args.max_parked_calls);
        let options = StoreOptions {
            log_engine: args.raft_log.into(),
            ..StoreOptions::default()
        };
        let opened = storage::open(&args.data_dir, options, hub.clone())?;
        let (log, sm) = (opened.log, opened.state_machine);
        let journal_log = log.clone();
        let dir = args.data_dir.display().to_string();
        let at_start = log_at_start(&log, &dir).await?;
        identity::check_or_record(
            &args,
            &identity::RaftState {
                fresh: opened.fresh,
                pristine: at_start.pristine,
            },
            restored_from,
        )?;
        let reader = sm.reader();
        hub.attach(reader.clone());
        let sync_stats = log.sync_stats();

        // The Raft core, its replication streams and its peer connections (both ways: peers'
        // Raft connections to this replica are served here too, see `accept`) run on a runtime
        // of their own: under heavy client load the main runtime's queue can hold thousands of
        // requests, and heartbeats waiting behind them would make followers start elections.
        // So do the loops that follow the core's metrics, which change on every turn of its loop.
        let raft_runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("coord-raft")
            .enable_all()
            .build()
            .map_err(|e| StartError::Raft(format!("cannot start the Raft runtime: {e}")))?;
        let config = Arc::new(raft_config(&args)?);
        let id = args.id;
        let network = Network::new(
            cluster_id,
            args.peer_source_ip,
            peer_tls.clone().zip(link_tls.clone()),
            !args.no_raft_links,
        );
        let pre_appends = network.clone();
        let link_stats = network.link_stats();
        let raft = raft_runtime
            .spawn(async move { Raft::new(id, config, network, log, sm).await })
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?
            .map_err(|e| StartError::Raft(e.to_string()))?;
        if !args.no_pre_append {
            journal_log
                .send_lone_writes_ahead(id, Arc::new(pre_appends.pre_appender(raft.clone(), id)));
        }

        let mut tasks = TaskGuard::default();
        if let Some(served) = served_cert {
            tasks.spawn("tls-reload", crate::ops::tls_reload::watch(served));
        }
        let metrics = Arc::new(Metrics::default());
        let contact = Arc::new(crate::raft::election::LeaderContact::default());
        contact.set_log(journal_log.clone());
        let leader = LeaderWatch::start(
            &raft,
            args.id,
            args.leader_lease(),
            at_start.floor,
            contact.clone(),
            raft_runtime.handle(),
            &mut tasks,
        );
        let proposer = Proposer::start(
            raft.clone(),
            args.id,
            args.max_inflight_proposals,
            leader.clone(),
            &mut tasks,
        );
        let read_index = ReadIndex::start(raft.clone(), args.id, &mut tasks);
        let router = Arc::new(Router::new(
            args.id,
            leader.clone(),
            args.leader_wait(),
            metrics.clone(),
            PeerChannels::new(args.peer_source_ip, peer_tls.clone()),
            crate::ops::limits::Limits::new(crate::ops::limits::LimitConfig {
                requests_per_second: args.max_requests_per_second_per_client,
                blocking_calls: args.max_blocking_calls_per_client,
            }),
            authz,
            reader.clone(),
        ));
        let kv = Arc::new(KvCore {
            proposer: proposer.clone(),
            read_index: read_index.clone(),
            reader: NsReader(reader.clone()),
            parked: hub.kv.clone(),
            limits: Limits {
                max_key_bytes: args.max_key_bytes,
                max_value_bytes: args.max_value_bytes,
                max_keys: args.max_keys,
            },
        });
        let heartbeats = Arc::new(crate::serve::heartbeats::Heartbeats::default());
        let coord = Arc::new(crate::serve::coordination::CoordCore {
            proposer: proposer.clone(),
            read_index: read_index.clone(),
            reader: NsReader(reader.clone()),
            hub: hub.clone(),
            heartbeats: heartbeats.clone(),
            devices: std::sync::Mutex::new(None),
            watched: std::sync::Mutex::new(None),
        });
        let dispatcher = Arc::new(crate::serve::dispatcher::DispatcherCore {
            proposer: proposer.clone(),
            read_index: read_index.clone(),
            reader: NsReader(reader.clone()),
            memories: crate::serve::dispatcher::memory::Memories::on(heartbeats.clock()),
            push: Default::default(),
            config: crate::serve::dispatcher::DispatcherConfig::from_args(&args),
        });
        tasks.spawn(
            "dispatcher-timers",
            crate::serve::dispatcher::timers::run(dispatcher.clone(), leader.clone()),
        );
        tasks.spawn(
            "quota",
            crate::serve::quota::run(
                args.quota_bytes,
                leader.clone(),
                reader.clone(),
                proposer.clone(),
            ),
        );
        let cluster_config = args.cluster().map_err(StartError::Config)?;
        tasks.spawn(
            "cluster-init",
            crate::serve::cluster_init::run(
                cluster_config,
                leader.clone(),
                reader.clone(),
                proposer.clone(),
            ),
        );
        tasks.spawn(
            "namespace-ttl",
            crate::serve::namespace_ttl::run(
                leader.clone(),
                reader.clone(),
                proposer.clone(),
                hub.clone(),
            ),
        );
        tasks.spawn(
            "heartbeat-check",
            crate::serve::heartbeats::check(
                heartbeats,
                leader.clone(),
                reader.clone(),
                proposer.clone(),
            ),
        );
        if let Some(deadlines) = hub.take_deadlines() {
            tasks.spawn(
                "barrier-timer",
                crate::serve::barrier_timer::run(deadlines, leader.clone(), reader, proposer),
            );
        }
        tasks.spawn_on(
            raft_runtime.handle(),
            "leader-watch",
            watch_leadership(raft.clone(), hub.clone(), metrics.clone()),
        );
        tasks.spawn(
            "election-nudge",
            crate::raft::election::nudge_elections(
                raft.clone(),
                args.id,
                args.leader_lease(),
                std::time::Duration::from_millis(args.election_timeout_min_ms),
                contact.clone(),
                PeerChannels::new(args.peer_source_ip, peer_tls.clone()),
            ),
        );
        Ok(Self {
            _data_lock: data_lock,
            args,
            raft,
            router,
            kv,
            coord,
            dispatcher,
            log: journal_log,
            leader: leader.clone(),
            hub,
            metrics,
            sync_stats,
            link_stats,
            cluster_id,
            contact,
            pristine: at_start.pristine,
            _tasks: tasks,
            raft_runtime: std::sync::Mutex::new(Some(raft_runtime)),
            server_tls,
            peer_tls,
            link_tls,
        })
    }

    /// Serves gRPC on `grpc` and HTTP on `http` until `shutdown` resolves, then stops Raft.
    pub async fn serve(
        self,
        grpc: TcpListener,
        http_listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        let this = Arc::new(self);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };

        let request_limit = this.args.max_value_bytes + this.args.max_key_bytes + (64 << 10);
        let tf = CoordinationServiceServer::from_arc(TfService::new(
            this.router.clone(),
            this.kv.clone(),
            this.coord.clone(),
        ))
        .max_decoding_message_size(request_limit.max(PEER_MESSAGE_LIMIT))
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
        .accept_compressed(CompressionEncoding::Gzip);
        let xla_job = this
            .args
            .xla_job
            .clone()
            .or_else(|| this.args.jobs.first().map(|(j, _)| j.clone()));
        let (router, coord) = (this.router.clone(), this.coord.clone());
        let xla_service = XlaService::new(router.clone(), this.kv.clone(), coord.clone(), xla_job);
        let xla = XlaServer::from_arc(xla_service.clone())
            .max_decoding_message_size(request_limit.max(PEER_MESSAGE_LIMIT))
            .max_encoding_message_size(PEER_MESSAGE_LIMIT)
            .accept_compressed(CompressionEncoding::Gzip);
        let raft_core = Arc::new(RaftService::new(
            this.raft.clone(),
            this.cluster_id,
            this.contact.clone(),
            this.router.authz().clone(),
        ));
        let raft_svc = RaftTransportServer::from_arc(raft_core.clone())
            .max_decoding_message_size(PEER_MESSAGE_LIMIT)
            .max_encoding_message_size(PEER_MESSAGE_LIMIT);
        let admin = AdminServer::new(AdminService::new(
            this.raft.clone(),
            this.router.clone(),
            this.coord.clone(),
            crate::raft::membership::MembershipAdmin::new(
                this.raft.clone(),
                this.args.id,
                this.peer_channels(),
            ),
            this.leader.clone(),
            this.cluster_id,
            crate::api::admin::Elections {
                handoff: this.handoff(),
                contact: this.contact.clone(),
                lease: this.args.leader_lease(),
            },
        ));
        // A sidecar's call carries up to `MAX_ARRIVALS` of its tasks' requests: as TensorFlow's own.
        let coordination = CoordinationServer::new(CoordService::new(router, coord, xla_service))
            .max_decoding_message_size(request_limit.max(PEER_MESSAGE_LIMIT))
            .max_encoding_message_size(PEER_MESSAGE_LIMIT);
        let kv_svc = KeyValueServer::new(crate::api::kv::KvService::new(
            this.router.clone(),
            this.kv.clone(),
            this.hub.clone(),
            this.leader.clone(),
            this.args.id,
        ))
        .max_decoding_message_size(request_limit.max(PEER_MESSAGE_LIMIT))
        .max_encoding_message_size(PEER_MESSAGE_LIMIT);
        let raw = Arc::new(crate::serve::raw_kv::RawCore {
            kv: this.kv.clone(),
            parked: this.hub.raw.clone(),
        });
        let raw_svc = coord_proto::coord::kv::raw_keys_server::RawKeysServer::new(
            crate::api::raw_kv::RawKeyService::new(this.router.clone(), raw),
        )
        .max_decoding_message_size(request_limit.max(PEER_MESSAGE_LIMIT))
        .max_encoding_message_size(PEER_MESSAGE_LIMIT);
        let dispatcher = DispatcherServer::new(crate::api::dispatcher::DispatcherService::new(
            this.router.clone(),
            this.dispatcher.clone(),
            this.log.clone(),
        ))
        .max_decoding_message_size(request_limit.max(PEER_MESSAGE_LIMIT))
        .max_encoding_message_size(PEER_MESSAGE_LIMIT);
        let tfdata =
            coord_proto::tensorflow::data::dispatcher_service_server::DispatcherServiceServer::new(
                crate::api::tfdata::TfDataService::new(
                    this.router.clone(),
                    this.dispatcher.clone(),
                ),
            )
            .max_decoding_message_size(PEER_MESSAGE_LIMIT)
            .max_encoding_message_size(PEER_MESSAGE_LIMIT)
            .accept_compressed(CompressionEncoding::Gzip);
        let server = || {
            tonic::transport::Server::builder()
                .initial_stream_window_size(Some(8 << 20))
                .initial_connection_window_size(Some(16 << 20))
                .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
                .max_concurrent_streams(Some(this.args.max_concurrent_streams))
                // hyper ends a connection (ENHANCE_YOUR_CALM) past 20 streams reset before it took
                // them up, or 1,024 it reset itself: a sidecar of 100 tasks cancels that many slow
                // calls at once, and every call parked on the connection would fail with it.
                .http2_max_pending_accept_reset_streams(Some(1 << 16))
                .http2_max_local_error_reset_streams(Some(1 << 16))
                .layer(crate::api::rewrite::RewriteLayer)
        };
        // Peers' Raft connections are served on the Raft runtime (see `accept`); the client
        // server answers Raft calls too, from peers that connect without the preface.
        let raft_server = server().add_service(raft_svc.clone());
        let grpc_server = server()
            .add_service(raft_svc)
            .add_service(tf)
            .add_service(xla)
            .add_service(admin)
            .add_service(NamespacesServer::new(NamespacesService::new(
                this.router.clone(),
                &this.coord,
                this.args.namespaces.defaults(),
            )))
            .add_service(coordination)
            .add_service(kv_svc)
            .add_service(raw_svc)
            .add_service(dispatcher)
            .add_service(tfdata);
        let raft_runtime = this
            .raft_runtime
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map_or_else(tokio::runtime::Handle::current, |rt| rt.handle().clone());
        // The port's connections, sorted (see `accept`): the same serving for plain and TLS
        // streams, which are of different types.
        macro_rules! serve_port {
            ($upgrade:expr) => {{
                let incoming = crate::raft::accept::incoming(grpc, $upgrade, raft_runtime.clone());
                raft_runtime
                    .spawn(raft_server.serve_with_incoming_shutdown(incoming.raft, stopped()));
                raft_runtime.spawn(crate::raft::accept::serve_links(
                    incoming.links,
                    raft_core,
                    this.log.clone(),
                    this.cluster_id,
                    this.link_tls.clone(),
                ));
                tokio::spawn(grpc_server.serve_with_incoming_shutdown(incoming.clients, stopped()))
            }};
        }
        let grpc_task = match this.server_tls.clone() {
            Some(tls) => serve_port!(crate::ops::tls::upgrade(tls)),
            None => serve_port!(|tcp, _| std::future::ready(Some(tcp))),
        };
        let http_task = tokio::spawn(crate::api::http::serve(
            http_listener,
            this.observed(),
            stopped(),
        ));

        if this.pristine && !this.args.join {
            this.bootstrap().await;
        }
        tracing::info!(
            id = this.args.id,
            grpc = %this.args.listen,
            http = %this.args.http_listen,
            "replica serving"
        );

        shutdown.await;
        tracing::info!(id = this.args.id, "shutting down");
        // A leader hands over first, while it still serves: its clients' calls are forwarded to
        // the new leader until their connections close.
        let handoff = this.handoff();
        if handoff.leads() {
            if let Err(e) = handoff.run(None).await {
                tracing::warn!(error = %e, "stopping without handing leadership over; the others will elect a leader");
            }
        }
        let _ = stop_tx.send(true);
        // Graceful shutdown waits for open connections to finish, and a client may keep its
        // connection forever: give them a bounded grace period, then cut them.
        let grace = tokio::time::sleep(SHUTDOWN_GRACE);
        tokio::pin!(grace);
        let (grpc_abort, http_abort) = (grpc_task.abort_handle(), http_task.abort_handle());
        let drained = async {
            if let Ok(Err(e)) = grpc_task.await {
                tracing::warn!(error = %e, "gRPC server ended with an error");
            }
            let _ = http_task.await;
        };
        tokio::select! {
            () = drained => {}
            () = &mut grace => {
                tracing::info!("clients still connected after {SHUTDOWN_GRACE:?}; closing their connections");
                grpc_abort.abort();
                http_abort.abort();
            }
        }
        if let Err(e) = this.raft.shutdown().await {
            tracing::warn!(error = %e, "Raft did not stop cleanly");
        }
        let raft_runtime = this
            .raft_runtime
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(rt) = raft_runtime {
            // Dropping a runtime inside another one is not allowed; let it wind down on its own.
            rt.shutdown_background();
        }
        Ok(())
    }

    /// Initializes a pristine ensemble from `--initial-cluster`. Every replica does this with the
    /// same membership, which openraft permits: the first entry is identical everywhere.
    async fn bootstrap(&self) {
        let members = self
            .args
            .initial_cluster
            .0
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect::<std::collections::BTreeMap<_, _>>();
        match self.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(members = %self.args.initial_cluster, "bootstrapped a new ensemble")
            }
            // Another replica got there first and this one already has its entry.
            Err(e) => tracing::info!(reason = %e, "not bootstrapping"),
        }
    }

    /// Channels to the other replicas, with this replica's source address and TLS.
    pub fn peer_channels(&self) -> PeerChannels {
        PeerChannels::new(self.args.peer_source_ip, self.peer_tls.clone())
    }

    pub fn status(&self) -> status::ReplicaStatus {
        status::ReplicaStatus::of(&self.raft, self.kv.reader.all())
    }

    /// Hands leadership over (see `raft::handoff`).
    pub fn handoff(&self) -> crate::raft::handoff::Handoff {
        crate::raft::handoff::Handoff::new(
            self.raft.clone(),
            self.args.id,
            self.peer_channels(),
            self.kv.proposer.clone(),
            self.leader.clone(),
            self.args.leader_lease(),
        )
    }

    /// What the HTTP port reads of this replica.
    fn observed(&self) -> crate::api::http::Observed {
        crate::api::http::Observed {
            raft: self.raft.clone(),
            listen: self.args.listen,
            lease_ms: self.args.election_timeout_max_ms,
            ready_max_lag: self.args.ready_max_lag,
            peers: self.peer_channels(),
            reader: self.kv.reader.all().clone(),
            rpcs: self.metrics.clone(),
            proposer: self.kv.proposer.stats().clone(),
            read_index: self.kv.read_index.stats().clone(),
            sync: self.sync_stats.clone(),
            links: self.link_stats.clone(),
            hub: self.hub.clone(),
            leader: self.leader.clone(),
            heartbeats: self.coord.heartbeats.clone(),
        }
    }
}

//! Command-line configuration of a replica, and its validation.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use coord_raft_store::state::ClusterConfig;

/// The largest `--quota-bytes`: with the records it counts, a state under it encodes well within
/// what a snapshot may decode to (`coord_raft_store::codec::MAX_DECODED_BYTES`).
pub const MAX_QUOTA_BYTES: u64 = 4 << 30;

/// The version `--version` prints and `coord_build_info` reports: the crate's, and the commit it
/// was built from (see build.rs).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("COORD_COMMIT"),
    ")"
);

/// One replica of a coord ensemble.
///
/// Start every replica of a new ensemble with the same `--initial-cluster` (and `--cluster-token`);
/// they find each other and elect a leader. Restart a replica with the same flags.
#[derive(Parser, Debug, Clone)]
#[command(name = "coordinator", version = VERSION, about, long_about = None)]
pub struct Args {
    /// This replica's id; must appear in --initial-cluster.
    #[arg(long, env = "COORD_ID")]
    pub id: u64,

    /// Address of the gRPC port (clients and peers).
    #[arg(long, env = "COORD_LISTEN")]
    pub listen: SocketAddr,

    /// Address of the HTTP port (/livez, /readyz, /metrics, /status).
    #[arg(long, env = "COORD_HTTP_LISTEN")]
    pub http_listen: SocketAddr,

    /// Every replica of the ensemble as `id=host:port`, comma separated.
    #[arg(long, value_parser = parse_initial_cluster, env = "COORD_INITIAL_CLUSTER")]
    pub initial_cluster: InitialCluster,

    /// Join a running ensemble instead of bootstrapping one: the replica waits until the leader
    /// adds it (`coordctl member add`). Give the ensemble's own --initial-cluster (it names the
    /// ensemble); this replica's id must not be in it.
    #[arg(long, env = "COORD_JOIN")]
    pub join: bool,

    /// Start a new ensemble from a backup (`coordctl snapshot save FILE`): give every replica of
    /// the new ensemble the same file on its first start, on an empty data directory (and any
    /// replica that joins it later). The new ensemble gets an identity of its own, so it never
    /// mixes with the one the backup came from. Later starts need no --restore.
    #[arg(long, value_name = "FILE", env = "COORD_RESTORE")]
    pub restore: Option<PathBuf>,

    /// Where this replica keeps its Raft log, vote and snapshots.
    #[arg(long, env = "COORD_DATA_DIR")]
    pub data_dir: PathBuf,

    /// The engine of the Raft log: `segments` (coord's own segment files) or `sled` (a sled
    /// database, flushed and then fdatasync'ed on every group commit). segments is the default:
    /// it measured faster per write and at start (docs/design.md, "Why not sled"). A data
    /// directory keeps the engine it was created with; starting it with the other is refused.
    #[arg(long, value_enum, default_value_t = RaftLogArg::Segments, env = "COORD_RAFT_LOG")]
    pub raft_log: RaftLogArg,

    /// Distinguishes ensembles started with the same --initial-cluster: replicas refuse data
    /// directories and Raft traffic of another token.
    #[arg(long, default_value = "coord", env = "COORD_CLUSTER_TOKEN")]
    pub cluster_token: String,

    /// Leader heartbeat interval.
    #[arg(long, default_value_t = 50, env = "COORD_HEARTBEAT_MS")]
    pub heartbeat_ms: u64,

    /// A follower that hears no leader for a random time in [min, max] starts an election.
    #[arg(long, default_value_t = 150, env = "COORD_ELECTION_TIMEOUT_MIN_MS")]
    pub election_timeout_min_ms: u64,

    /// Also the leader lease: a voter refuses other candidates this long after it last heard
    /// from its leader, and a leader serves only this long after a quorum last acknowledged it.
    #[arg(long, default_value_t = 300, env = "COORD_ELECTION_TIMEOUT_MAX_MS")]
    pub election_timeout_max_ms: u64,

    /// Take a snapshot (and purge the log before it) after this many entries.
    #[arg(long, default_value_t = 10_000, env = "COORD_SNAPSHOT_EVERY_ENTRIES")]
    pub snapshot_every_entries: u64,

    /// Longest key accepted, in bytes (after normalization).
    #[arg(long, default_value_t = 4096, env = "COORD_MAX_KEY_BYTES")]
    pub max_key_bytes: usize,

    /// Largest value accepted, in bytes.
    #[arg(long, default_value_t = 4 << 20, env = "COORD_MAX_VALUE_BYTES")]
    pub max_value_bytes: usize,

    /// Most keys the store holds; inserting a new key past it fails RESOURCE_EXHAUSTED (0: no
    /// limit). Checked on the leader before proposing, so writes already in flight may overshoot
    /// it by their number.
    #[arg(long, default_value_t = 10_000_000, env = "COORD_MAX_KEYS")]
    pub max_keys: u64,

    /// Requests a second one client may send to this replica, with a burst of one second's worth
    /// (0: no limit). A client is its request-id client, or its connection.
    #[arg(
        long,
        default_value_t = 50_000,
        env = "COORD_MAX_REQUESTS_PER_SECOND_PER_CLIENT"
    )]
    pub max_requests_per_second_per_client: u32,

    /// Blocking calls (GetKeyValue, barriers, WaitForAllTasks, error polls) one client may have in
    /// flight at this replica (0: no limit).
    #[arg(
        long,
        default_value_t = 100_000,
        env = "COORD_MAX_BLOCKING_CALLS_PER_CLIENT"
    )]
    pub max_blocking_calls_per_client: usize,

    /// Parked calls (blocking gets, barrier waits, error polls, task watches) and key watch streams
    /// the leader holds across all clients (0: no bound). Each costs about 3–5 KB of memory (a
    /// jaxlib GetAliveTasks call about 10 KB); past the bound new ones fail RESOURCE_EXHAUSTED at
    /// once and the replica stays healthy. The default holds a 100,000-task job with every task
    /// parked twice (a barrier and WaitForAllTasks, or an error poll), about 0.7 GB.
    #[arg(long, default_value_t = 250_000, env = "COORD_MAX_PARKED_CALLS")]
    pub max_parked_calls: usize,

    /// The limits of namespaces that leave them to the ensemble.
    #[command(flatten)]
    pub namespaces: crate::ops::namespace_flags::NamespaceFlags,

    /// The memory quota on the replicated state, in bytes (keys, values, task and dispatcher
    /// records; 0: none). Past it writes that grow the state fail RESOURCE_EXHAUSTED and an alarm
    /// is raised until deletes bring usage below 95% of it. At most 4 GiB. The leader's is in force.
    #[arg(long, default_value_t = 2 << 30, env = "COORD_QUOTA_BYTES")]
    pub quota_bytes: u64,

    /// Concurrent HTTP/2 streams per client connection (each parked call holds one); further
    /// calls wait in the client for a free stream. tonic's own default is no limit.
    #[arg(long, default_value_t = 16_384, env = "COORD_MAX_CONCURRENT_STREAMS")]
    pub max_concurrent_streams: u32,

    /// How long a request waits for a reachable leader before it fails UNAVAILABLE.
    #[arg(long, default_value_t = 5_000, env = "COORD_LEADER_WAIT_MS")]
    pub leader_wait_ms: u64,

    /// Raft entries the leader keeps in flight; writes arriving meanwhile are batched into the
    /// next entry.
    #[arg(long, default_value_t = 4, env = "COORD_MAX_INFLIGHT_PROPOSALS")]
    pub max_inflight_proposals: usize,

    /// Do not send a lone write to the followers while the leader syncs it; they then receive
    /// it only after the leader's sync (openraft's order). Sending it ahead makes the three
    /// replicas' syncs overlap.
    #[arg(long, env = "COORD_NO_PRE_APPEND")]
    pub no_pre_append: bool,

    /// Send AppendEntries over gRPC only, not over framed links (TLS links in a TLS ensemble;
    /// they spare each replication round trip HTTP/2 and tonic).
    #[arg(long, env = "COORD_NO_RAFT_LINKS")]
    pub no_raft_links: bool,

    /// A coordinated job and its task count, `name=count` (repeat for each job), e.g.
    /// `--job worker=4 --job ps=2`.
    #[arg(long = "job", value_parser = coord_proto::shape::parse_job, value_delimiter = ',', env = "COORD_JOB")]
    pub jobs: Vec<(String, u32)>,

    /// A JSON file with the cluster configuration instead of the --job and timeout flags:
    /// `{"jobs": {"worker": 4}, "heartbeat_timeout_ms": 10000, "register_timeout_ms": 0,
    /// "shutdown_barrier_timeout_ms": 0, "recoverable_jobs": []}` (fields may be left out).
    #[arg(long, env = "COORD_CLUSTER_CONFIG")]
    pub cluster_config: Option<PathBuf>,

    /// A connected task that sends no heartbeat for this long is put in ERROR.
    #[arg(long, default_value_t = 10_000, env = "COORD_HEARTBEAT_TIMEOUT_MS")]
    pub heartbeat_timeout_ms: u64,

    /// WaitForAllTasks fails if not every task has arrived this long after the first (0 = wait
    /// forever).
    #[arg(long, default_value_t = 0, env = "COORD_REGISTER_TIMEOUT_MS")]
    pub register_timeout_ms: u64,

    /// ShutdownTask waits up to this long for every task, so that all disconnect together
    /// (0 = each task disconnects at once).
    #[arg(long, default_value_t = 0, env = "COORD_SHUTDOWN_BARRIER_TIMEOUT_MS")]
    pub shutdown_barrier_timeout_ms: u64,

    /// The job whose tasks XLA's integer task ids name on `xla.coordination.CoordinationService`
    /// (default: the first --job, or the first job of --cluster-config in name order). Give
    /// every replica the same value.
    #[arg(long, env = "COORD_XLA_JOB")]
    pub xla_job: Option<String>,

    /// A job whose tasks may restart without failing the others (repeatable).
    #[arg(
        long = "recoverable-job",
        value_delimiter = ',',
        env = "COORD_RECOVERABLE_JOB"
    )]
    pub recoverable_jobs: Vec<String>,

    /// Bind outgoing connections to other replicas to this local address (on a host with several
    /// interfaces; the fault-injection tests also use it to tell replicas apart).
    #[arg(long, env = "COORD_PEER_SOURCE_IP")]
    pub peer_source_ip: Option<std::net::IpAddr>,

    /// Threads of the async runtime; 0 = one per CPU core.
    #[arg(long, default_value_t = 0, env = "COORD_WORKER_THREADS")]
    pub worker_threads: usize,

    /// The dispatcher declares a data worker dead after this long without a heartbeat, and hands
    /// the splits it had not delivered to other workers.
    #[arg(
        long,
        default_value_t = 10_000,
        env = "COORD_DISPATCHER_WORKER_TIMEOUT_MS"
    )]
    pub dispatcher_worker_timeout_ms: u64,

    /// The dispatcher releases a job client after this long without a heartbeat (TF: 5 min).
    #[arg(
        long,
        default_value_t = 300_000,
        env = "COORD_DISPATCHER_CLIENT_TIMEOUT_MS"
    )]
    pub dispatcher_client_timeout_ms: u64,

    /// A job (other than DYNAMIC) with no clients for this long is garbage-collected (TF: 5 min).
    #[arg(
        long,
        default_value_t = 300_000,
        env = "COORD_DISPATCHER_JOB_GC_TIMEOUT_MS"
    )]
    pub dispatcher_job_gc_timeout_ms: u64,

    /// TensorFlow's tf.data service: the fixed list of workers that static sharding (FILE, DATA,
    /// FILE_OR_DATA, HINT) divides the data among, as TF's `DispatcherConfig.worker_addresses`
    /// (`host:port`, or `host:%port%` for any port on that host). The same on every replica.
    #[arg(long, env = "COORD_TFDATA_WORKER_ADDRESSES", value_delimiter = ',')]
    pub tfdata_worker_addresses: Vec<String>,

    /// A TensorFlow tf.data worker silent this long is lost: iterations made meanwhile get no
    /// task on it (it gets them when it heartbeats again). TF's workers heartbeat every 30 s by
    /// default.
    #[arg(
        long,
        default_value_t = 120_000,
        env = "COORD_TFDATA_WORKER_TIMEOUT_MS"
    )]
    pub tfdata_worker_timeout_ms: u64,

    /// /readyz fails while this replica is more entries than this behind the leader.
    #[arg(long, default_value_t = 1_000, env = "COORD_READY_MAX_LAG")]
    pub ready_max_lag: u64,

    /// This replica's certificate (PEM, leaf first). With --tls-key and --tls-ca the gRPC port
    /// speaks TLS only, replicas accept Raft traffic only from each other, and callers'
    /// certificates are checked (see --tls-client-auth). Its alternative names hold
    /// `coord://<cluster-token>/replica/<id>` and the host name or address clients and peers
    /// reach it by. It is also the certificate this replica presents to its peers.
    #[arg(long, requires_all = ["tls_key", "tls_ca"], env = "COORD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// The private key of --tls-cert (PEM).
    #[arg(long, requires_all = ["tls_cert", "tls_ca"], env = "COORD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// The ensemble's CA certificate (PEM): peers, tasks and operators present certificates it
    /// signed, and peers' servers are checked against it.
    #[arg(long, requires_all = ["tls_cert", "tls_key"], env = "COORD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// With TLS: `optional` lets callers connect without a certificate (a caller that presents
    /// one is held to its identity: a task may act only as itself); `require` refuses them at
    /// the handshake. Raft traffic always needs a replica certificate.
    #[arg(long, value_enum, default_value_t = ClientAuthArg::Optional, env = "COORD_TLS_CLIENT_AUTH")]
    pub tls_client_auth: ClientAuthArg,
}

/// `--tls-client-auth`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientAuthArg {
    Optional,
    Require,
}

/// `--raft-log`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RaftLogArg {
    Segments,
    Sled,
}

impl From<RaftLogArg> for coord_raft_store::storage::RaftLogEngine {
    fn from(arg: RaftLogArg) -> Self {
        match arg {
            RaftLogArg::Segments => Self::Segments,
            RaftLogArg::Sled => Self::Sled,
        }
    }
}

/// `--initial-cluster`: replica id → address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InitialCluster(pub BTreeMap<u64, String>);

fn parse_initial_cluster(s: &str) -> Result<InitialCluster, String> {
    let mut members = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not of the form id=host:port"))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| format!("replica id {id:?} in {part:?} is not a number"))?;
        let addr = addr.trim();
        if addr
            .rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
        {
            return Err(format!("address {addr:?} of replica {id} is not host:port"));
        }
        if members.insert(id, addr.to_string()).is_some() {
            return Err(format!("replica {id} appears twice"));
        }
    }
    if members.is_empty() {
        return Err("no replicas given".into());
    }
    Ok(InitialCluster(members))
}

impl Args {
    /// Checks the combination of flags; the message says which flag to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.join && self.initial_cluster.0.contains_key(&self.id) {
            return Err(format!(
                "--join: replica {} is one of the ensemble's initial replicas; a joining replica needs an id of its own",
                self.id
            ));
        }
        if !self.join && !self.initial_cluster.0.contains_key(&self.id) {
            return Err(format!(
                "--id {} is not one of the replicas in --initial-cluster ({})",
                self.id,
                self.initial_cluster.ids()
            ));
        }
        if self.election_timeout_min_ms >= self.election_timeout_max_ms {
            return Err("--election-timeout-min-ms must be below --election-timeout-max-ms".into());
        }
        if self.heartbeat_ms * 2 > self.election_timeout_min_ms {
            return Err("--heartbeat-ms must be at most half of --election-timeout-min-ms".into());
        }
        if self.quota_bytes > MAX_QUOTA_BYTES {
            return Err(format!(
                "--quota-bytes {} is over the largest quota, {MAX_QUOTA_BYTES} bytes (4 GiB): a snapshot of the whole state must stay decodable",
                self.quota_bytes
            ));
        }
        if self.max_inflight_proposals == 0 {
            return Err("--max-inflight-proposals must be at least 1".into());
        }
        self.cluster().map(|_| ())
    }

    /// How long a leader trusts its last quorum acknowledgement: the longest election timeout,
    /// after which a new leader may exist.
    pub fn leader_lease(&self) -> Duration {
        Duration::from_millis(self.election_timeout_max_ms)
    }

    /// The coordinated job, from --cluster-config or from the flags.
    pub fn cluster(&self) -> Result<ClusterConfig, String> {
        let mut config = ClusterConfig {
            jobs: self.jobs.iter().cloned().collect(),
            heartbeat_timeout_ms: self.heartbeat_timeout_ms,
            register_timeout_ms: self.register_timeout_ms,
            shutdown_barrier_timeout_ms: self.shutdown_barrier_timeout_ms,
            recoverable_jobs: self.recoverable_jobs.iter().cloned().collect(),
        };
        if self.jobs.len() != config.jobs.len() {
            return Err("a job is given twice with --job".into());
        }
        if let Some(path) = &self.cluster_config {
            if !self.jobs.is_empty() || !self.recoverable_jobs.is_empty() {
                return Err("give the jobs either with --job/--recoverable-job or in --cluster-config, not both".into());
            }
            let file = coord_proto::shape::ClusterFile::read(path)?;
            config.jobs = file.jobs;
            config.recoverable_jobs = file.recoverable_jobs.into_iter().collect();
            config.heartbeat_timeout_ms = file
                .heartbeat_timeout_ms
                .unwrap_or(config.heartbeat_timeout_ms);
            config.register_timeout_ms = file
                .register_timeout_ms
                .unwrap_or(config.register_timeout_ms);
            config.shutdown_barrier_timeout_ms = file
                .shutdown_barrier_timeout_ms
                .unwrap_or(config.shutdown_barrier_timeout_ms);
        }
        if let Some((job, _)) = config.jobs.iter().find(|(j, n)| j.is_empty() || **n == 0) {
            return Err(format!("job {job:?} needs a name and at least one task"));
        }
        if let Some(r) = config
            .recoverable_jobs
            .iter()
            .find(|r| !config.jobs.contains_key(*r))
        {
            return Err(format!("recoverable job {r:?} is not one of the jobs"));
        }
        if config.heartbeat_timeout_ms == 0 {
            return Err("--heartbeat-timeout-ms must be positive".into());
        }
        Ok(config)
    }

    pub fn leader_wait(&self) -> Duration {
        Duration::from_millis(self.leader_wait_ms)
    }
}

impl InitialCluster {
    fn ids(&self) -> String {
        self.0
            .keys()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// A stable id for the ensemble, from its token and initial members (as etcd derives its
    /// cluster id): two ensembles started alike but with different tokens never mix.
    pub fn cluster_id(&self, token: &str) -> u64 {
        let mut h = crc32fast::Hasher::new();
        h.update(token.as_bytes());
        for (id, addr) in &self.0 {
            h.update(&id.to_le_bytes());
            h.update(addr.as_bytes());
        }
        let lo = u64::from(h.finalize());
        let mut h2 = crc32fast::Hasher::new_with_initial(0x9e37_79b9);
        h2.update(token.as_bytes());
        h2.update(&lo.to_le_bytes());
        (u64::from(h2.finalize()) << 32) | lo
    }
}

impl std::fmt::Display for InitialCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(id, a)| format!("{id}={a}")).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

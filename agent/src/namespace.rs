//! A namespace's shape and limits as flags: the same flags the replicas take for the default
//! namespace's job (`--job`, `--heartbeat-timeout-ms`, `--cluster-config`...), read by
//! coord-proxy `--namespace` (which declares its namespace on first contact) and `coordctl ns
//! create`.

use std::path::PathBuf;

use coord_proto::coord::admin::{DeclareNamespaceRequest, NamespaceLimits, NamespaceShape};
use coord_proto::shape::{parse_job, ClusterFile};

/// The job of a namespace.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ShapeArgs {
    /// A job of the namespace and its task count, `name=count` (repeat for each job). None: a
    /// namespace of keys only (torch's store).
    #[arg(long = "job", value_parser = parse_job, value_delimiter = ',')]
    pub jobs: Vec<(String, u32)>,
    /// A JSON file with the job instead of the --job and timeout flags, as the replicas'
    /// --cluster-config.
    #[arg(long)]
    pub cluster_config: Option<PathBuf>,
    /// A connected task that sends no heartbeat for this long is put in ERROR.
    #[arg(long, default_value_t = 10_000)]
    pub heartbeat_timeout_ms: u64,
    /// WaitForAllTasks fails if not every task arrived this long after the first (0: never).
    #[arg(long, default_value_t = 0)]
    pub register_timeout_ms: u64,
    /// ShutdownTask waits up to this long for every task (0: each disconnects at once).
    #[arg(long, default_value_t = 0)]
    pub shutdown_barrier_timeout_ms: u64,
    /// A job whose tasks may restart without failing the others (repeatable).
    #[arg(long = "recoverable-job", value_delimiter = ',')]
    pub recoverable_jobs: Vec<String>,
}

/// A namespace's limits; 0 (the default) takes the ensemble's (its `--namespace-*` flags).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LimitArgs {
    /// Bytes of state the namespace may hold.
    #[arg(long = "namespace-max-bytes", default_value_t = 0)]
    pub namespace_max_bytes: u64,
    /// Keys the namespace may hold.
    #[arg(long = "namespace-max-keys", default_value_t = 0)]
    pub namespace_max_keys: u64,
    /// Tasks its job may have.
    #[arg(long = "namespace-max-tasks", default_value_t = 0)]
    pub namespace_max_tasks: u64,
    /// Calls it may have parked on the leader, watches included.
    #[arg(long = "namespace-max-parked", default_value_t = 0)]
    pub namespace_max_parked: u64,
    /// Writes per second, sustained.
    #[arg(long = "namespace-writes-per-sec", default_value_t = 0)]
    pub namespace_writes_per_sec: u64,
    /// Writes at once above the rate.
    #[arg(long = "namespace-write-burst", default_value_t = 0)]
    pub namespace_write_burst: u64,
    /// Deleted this long after its last command once no task is connected.
    #[arg(long = "namespace-ttl-ms", default_value_t = 0)]
    pub namespace_ttl_ms: u64,
}

impl ShapeArgs {
    /// The shape the flags give; errors name the flag.
    pub fn shape(&self) -> Result<NamespaceShape, String> {
        let mut shape = NamespaceShape {
            jobs: self.jobs.iter().cloned().collect(),
            heartbeat_timeout_ms: self.heartbeat_timeout_ms,
            register_timeout_ms: self.register_timeout_ms,
            shutdown_barrier_timeout_ms: self.shutdown_barrier_timeout_ms,
            recoverable_jobs: self.recoverable_jobs.clone(),
        };
        if shape.jobs.len() != self.jobs.len() {
            return Err("a job is given twice with --job".into());
        }
        if let Some(path) = &self.cluster_config {
            if !self.jobs.is_empty() || !self.recoverable_jobs.is_empty() {
                return Err("give the jobs either with --job/--recoverable-job or in --cluster-config, not both".into());
            }
            let file = ClusterFile::read(path)?;
            shape.jobs = file.jobs.into_iter().collect();
            shape.recoverable_jobs = file.recoverable_jobs;
            shape.heartbeat_timeout_ms = file
                .heartbeat_timeout_ms
                .unwrap_or(shape.heartbeat_timeout_ms);
            shape.register_timeout_ms = file
                .register_timeout_ms
                .unwrap_or(shape.register_timeout_ms);
            shape.shutdown_barrier_timeout_ms = file
                .shutdown_barrier_timeout_ms
                .unwrap_or(shape.shutdown_barrier_timeout_ms);
        }
        if let Some(j) = shape
            .recoverable_jobs
            .iter()
            .find(|j| !shape.jobs.contains_key(*j))
        {
            return Err(format!(
                "recoverable job {j:?} is not a job of the namespace"
            ));
        }
        Ok(shape)
    }
}

impl LimitArgs {
    pub fn limits(&self) -> NamespaceLimits {
        NamespaceLimits {
            max_bytes: self.namespace_max_bytes,
            max_keys: self.namespace_max_keys,
            max_tasks: self.namespace_max_tasks,
            max_parked: self.namespace_max_parked,
            writes_per_sec: self.namespace_writes_per_sec,
            write_burst: self.namespace_write_burst,
            ttl_ms: self.namespace_ttl_ms,
        }
    }
}

/// The declaration of namespace `name` the flags make.
pub fn declaration(
    name: &str,
    shape: &ShapeArgs,
    limits: &LimitArgs,
) -> Result<DeclareNamespaceRequest, String> {
    Ok(DeclareNamespaceRequest {
        name: name.to_string(),
        shape: Some(shape.shape()?),
        limits: Some(limits.limits()),
    })
}

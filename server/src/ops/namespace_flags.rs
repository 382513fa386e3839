//! The limits a namespace gets when its declaration leaves them to the ensemble
//! (`--namespace-*`). A declaration may ask for other limits; over TLS a task's certificate may
//! only ask for these or lower (an operator's may ask for any).

use coord_raft_store::state::NamespaceLimits;

#[derive(clap::Args, Debug, Clone)]
pub struct NamespaceFlags {
    /// A namespace's state, in bytes (keys, values and records, counted as --quota-bytes counts
    /// them; 0: no limit but the ensemble's quota).
    #[arg(
        long = "namespace-max-bytes",
        default_value_t = 256 << 20,
        env = "COORD_NAMESPACE_MAX_BYTES"
    )]
    pub namespace_max_bytes: u64,
    /// Keys a namespace may hold, path and raw (0: no limit).
    #[arg(
        long = "namespace-max-keys",
        default_value_t = 1_000_000,
        env = "COORD_NAMESPACE_MAX_KEYS"
    )]
    pub namespace_max_keys: u64,
    /// Tasks a namespace's job may have (0: no limit).
    #[arg(
        long = "namespace-max-tasks",
        default_value_t = 100_000,
        env = "COORD_NAMESPACE_MAX_TASKS"
    )]
    pub namespace_max_tasks: u64,
    /// Calls a namespace may have parked on the leader, watch streams included (0: only the
    /// ensemble's --max-parked-calls).
    #[arg(
        long = "namespace-max-parked",
        default_value_t = 20_000,
        env = "COORD_NAMESPACE_MAX_PARKED"
    )]
    pub namespace_max_parked: u64,
    /// Writes per second a namespace may make, sustained (0: no limit); past it, writes fail
    /// RESOURCE_EXHAUSTED before they enter the log.
    #[arg(
        long = "namespace-writes-per-sec",
        default_value_t = 0,
        env = "COORD_NAMESPACE_WRITES_PER_SEC"
    )]
    pub namespace_writes_per_sec: u64,
    /// Writes a namespace may make at once above its rate (default: one second's worth).
    #[arg(
        long = "namespace-write-burst",
        default_value_t = 0,
        env = "COORD_NAMESPACE_WRITE_BURST"
    )]
    pub namespace_write_burst: u64,
    /// A namespace is deleted this long after its last command once no task of it is connected
    /// and nothing of it is parked (0: kept until deleted; the default namespace is never).
    #[arg(
        long = "namespace-ttl-ms",
        default_value_t = 86_400_000,
        env = "COORD_NAMESPACE_TTL_MS"
    )]
    pub namespace_ttl_ms: u64,
}

impl NamespaceFlags {
    /// The limits a declaration gets for every field it leaves 0.
    pub fn defaults(&self) -> NamespaceLimits {
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

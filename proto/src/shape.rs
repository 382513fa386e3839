//! A coordinated job's shape as coord's flags spell it, read the same way by the replicas (the
//! default namespace's job), coord-proxy `--namespace` and `coordctl ns create` (a namespace's).

use std::collections::BTreeMap;
use std::path::Path;

/// `--job name=count`.
pub fn parse_job(s: &str) -> Result<(String, u32), String> {
    let (name, count) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not of the form name=count"))?;
    let name = name.trim();
    if name.is_empty() {
        return Err(format!("{s:?}: the job name is empty"));
    }
    let count: u32 = count
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: task count {count:?} is not a number"))?;
    if count == 0 {
        return Err(format!("{s:?}: a job needs at least one task"));
    }
    Ok((name.to_string(), count))
}

/// `--cluster-config FILE`: the job's shape as JSON (every field optional).
#[derive(serde::Deserialize, Default, Debug, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterFile {
    pub jobs: BTreeMap<String, u32>,
    pub heartbeat_timeout_ms: Option<u64>,
    pub register_timeout_ms: Option<u64>,
    pub shutdown_barrier_timeout_ms: Option<u64>,
    pub recoverable_jobs: Vec<String>,
}

impl ClusterFile {
    /// Reads the file at `path`; errors name it.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--cluster-config {}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("--cluster-config {}: {e}", path.display()))
    }
}

//! The coord agent as a benchmark target: the calls a training task makes, through the same
//! failover as in a real job.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use coord_agent::{Agent, AgentConfig};

use super::KvTarget;

pub struct AgentTarget {
    agents: Vec<Agent>,
    calls: AtomicU64,
}

impl AgentTarget {
    /// `count` agents (tasks `0..count` of job `worker`), not connected: key-value calls need no
    /// registration.
    pub fn new(endpoints: Vec<String>, count: usize) -> Result<Self, String> {
        let agents = (0..count.max(1))
            .map(|i| {
                let config = AgentConfig::new(
                    endpoints.clone(),
                    "worker",
                    i32::try_from(i).unwrap_or(i32::MAX),
                );
                Agent::new(config, |_| {}).map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            agents,
            calls: AtomicU64::new(0),
        })
    }
}

impl KvTarget for AgentTarget {
    /// Alternates an increment and an overwrite, the two kinds of mutation a task makes.
    async fn put(&self, conn: usize, key: String, value: Bytes) -> Result<(), String> {
        let a = &self.agents[conn];
        if self.calls.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            a.increment_key_value(&format!("{key}/count"), 1)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        } else {
            a.update_key_value(&key, value)
                .await
                .map_err(|e| e.to_string())
        }
    }

    async fn get(&self, conn: usize, key: String) -> Result<(), String> {
        self.agents[conn]
            .try_get_key_value(&key)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn connections(&self) -> usize {
        self.agents.len()
    }
}

//! A blocking face of [`Agent`] for callers without an async runtime (TensorFlow's agent API is
//! synchronous). It owns a small runtime on which the agent's loops, watches and calls run.

use std::time::Duration;

use bytes::Bytes;
use coord_proto::tensorflow as tf;
use tokio::runtime::Runtime;
use tonic::Status;

use crate::agent::{Agent, AgentConfig, AgentState, TaskStatus};
use crate::watch::KeyChange;

pub struct BlockingAgent {
    runtime: Runtime,
    agent: Agent,
}

impl BlockingAgent {
    pub fn new(
        config: AgentConfig,
        on_error: impl Fn(&Status) + Send + Sync + 'static,
    ) -> Result<Self, Status> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("coord-agent")
            .enable_all()
            .build()
            .map_err(|e| Status::internal(format!("cannot start the agent's runtime: {e}")))?;
        let agent = {
            let _enter = runtime.enter();
            Agent::new(config, on_error)?
        };
        Ok(Self { runtime, agent })
    }

    /// The async agent underneath.
    pub fn agent(&self) -> &Agent {
        &self.agent
    }

    pub fn state(&self) -> AgentState {
        self.agent.state()
    }

    pub fn connect(&self) -> Result<(), Status> {
        self.runtime.block_on(self.agent.connect())
    }

    pub fn wait_for_all_tasks(
        &self,
        devices: Option<tf::CoordinationServiceDeviceInfo>,
    ) -> Result<(), Status> {
        self.runtime
            .block_on(self.agent.wait_for_all_tasks(devices))
    }

    pub fn cluster_device_attributes(&self) -> Option<tf::CoordinationServiceDeviceInfo> {
        self.agent.cluster_device_attributes()
    }

    pub fn task_status(&self, job: &str, task_id: i32) -> Result<TaskStatus, Status> {
        self.runtime.block_on(self.agent.task_status(job, task_id))
    }

    /// As [`Agent::report_error`]: FAILED_PRECONDITION, and the first error kept, if the agent is
    /// already in ERROR.
    pub fn report_error(&self, error: &Status) -> Result<(), Status> {
        self.runtime.block_on(self.agent.report_error(error))
    }

    pub fn reset(&self) -> Result<(), Status> {
        self.runtime.block_on(self.agent.reset())
    }

    pub fn shutdown(&self) -> Result<(), Status> {
        self.runtime.block_on(self.agent.shutdown())
    }

    pub fn get_key_value(&self, key: &str, timeout: Option<Duration>) -> Result<Bytes, Status> {
        self.runtime
            .block_on(self.agent.get_key_value(key, timeout))
    }

    pub fn try_get_key_value(&self, key: &str) -> Result<Option<Bytes>, Status> {
        self.runtime.block_on(self.agent.try_get_key_value(key))
    }

    pub fn insert_key_value(&self, key: &str, value: impl Into<Bytes>) -> Result<(), Status> {
        self.runtime
            .block_on(self.agent.insert_key_value(key, value))
    }

    pub fn update_key_value(&self, key: &str, value: impl Into<Bytes>) -> Result<(), Status> {
        self.runtime
            .block_on(self.agent.update_key_value(key, value))
    }

    pub fn delete_key_value(&self, key: &str) -> Result<(), Status> {
        self.runtime.block_on(self.agent.delete_key_value(key))
    }

    pub fn get_key_value_dir(&self, dir: &str) -> Result<Vec<(String, Bytes)>, Status> {
        self.runtime.block_on(self.agent.get_key_value_dir(dir))
    }

    pub fn increment_key_value(&self, key: &str, delta: i64) -> Result<i64, Status> {
        self.runtime
            .block_on(self.agent.increment_key_value(key, delta))
    }

    pub fn wait_at_barrier(
        &self,
        id: &str,
        timeout: Duration,
        tasks: &[tf::CoordinatedTask],
    ) -> Result<(), Status> {
        self.runtime
            .block_on(self.agent.wait_at_barrier(id, timeout, tasks))
    }

    pub fn cancel_barrier(&self, id: &str) -> Result<(), Status> {
        self.runtime.block_on(self.agent.cancel_barrier(id))
    }

    pub fn start_watch_key(
        &self,
        key: &str,
        on_change: impl Fn(Result<Vec<KeyChange>, Status>) + Send + Sync + 'static,
    ) -> Result<(), Status> {
        let _enter = self.runtime.enter();
        self.agent.start_watch_key(key, on_change)
    }

    pub fn stop_watch_key(&self, key: &str) -> Result<(), Status> {
        self.agent.stop_watch_key(key)
    }
}

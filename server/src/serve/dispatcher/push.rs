//! Pushing new tasks to TensorFlow's workers (`WorkerService.ProcessTask`), as TensorFlow's
//! dispatcher does when GetOrCreateIteration makes an iteration: the worker starts producing at
//! once instead of at its next heartbeat. Best effort: a worker that cannot be reached gets the
//! task from its next heartbeat's answer, as in TF.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use coord_proto::tensorflow::data::worker_service_client::WorkerServiceClient;
use coord_proto::tensorflow::data::{ProcessTaskRequest, TaskDef};
use tonic::transport::{Channel, Endpoint};

/// How long one push may take before the task is left to the worker's heartbeat.
const PUSH_TIMEOUT: Duration = Duration::from_secs(2);
/// A TaskDef carries the dataset's graph.
const MESSAGE_LIMIT: usize = 64 << 20;

#[derive(Default)]
pub struct WorkerPush {
    channels: Mutex<HashMap<String, Channel>>,
}

impl WorkerPush {
    fn channel(&self, address: &str) -> Option<Channel> {
        let mut g = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = g.get(address) {
            return Some(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{address}")).ok()?;
        let channel = endpoint
            .connect_timeout(PUSH_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        g.insert(address.to_string(), channel.clone());
        Some(channel)
    }

    /// Sends every task to its worker, all at once, and waits for the answers (at most
    /// [`PUSH_TIMEOUT`]).
    pub async fn push(&self, tasks: Vec<(String, TaskDef)>) {
        let calls = tasks.into_iter().filter_map(|(address, task)| {
            let channel = self.channel(&address)?;
            Some(async move {
                let task_id = task.task_id;
                let mut client = WorkerServiceClient::new(channel)
                    .max_encoding_message_size(MESSAGE_LIMIT)
                    .max_decoding_message_size(MESSAGE_LIMIT);
                let call = client.process_task(ProcessTaskRequest { task: Some(task) });
                match tokio::time::timeout(PUSH_TIMEOUT, call).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::debug!(worker = %address, task_id, error = %e,
                        "could not push a task; the worker gets it from its next heartbeat"),
                    Err(_) => tracing::debug!(worker = %address, task_id,
                        "pushing a task timed out; the worker gets it from its next heartbeat"),
                }
            })
        });
        futures::future::join_all(calls).await;
    }
}

//! Errors pushed to the local TensorFlow task, as TensorFlow's own service pushes them.
//!
//! TensorFlow's service calls `ReportErrorToTask` on every task's server when a task fails, and
//! the task's agent aborts its collectives at once. The ensemble does not know where its tasks
//! listen, so its errors reach TF agents as the answer to their next heartbeat, up to a heartbeat
//! interval (5 s) later. A coord-proxy told which task it serves and where that task's server is
//! (`--task worker:1 --push-errors-to 10.0.0.6:2222`, the task's own `TF_CONFIG` entry) closes
//! that gap: it long-polls the ensemble for the errors the task must learn of, and pushes each to
//! the task the moment the ensemble commits it.
//!
//! Only errors for the incarnation that is connected are pushed: after an error, the pusher waits
//! for the task to register anew (a new process) before it polls again, so a restarted process is
//! never told of its predecessor's run.

use std::time::Duration;

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_proto::tensorflow::distributed_runtime::coordination_error;
use tonic::{Code, Status};

use crate::client::CoordClient;

/// How often the task's registration is looked at while there is nothing to poll.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Parses `job:id` (e.g. `worker:1`).
pub fn parse_task(s: &str) -> Result<tf::CoordinatedTask, String> {
    let (job, id) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("task {s:?} is not JOB:ID (e.g. worker:1)"))?;
    let task_id = id
        .parse::<i32>()
        .ok()
        .filter(|i| *i >= 0)
        .ok_or_else(|| format!("task {s:?}: {id:?} is not a task index"))?;
    if job.is_empty() {
        return Err(format!("task {s:?} names no job"));
    }
    Ok(tf::CoordinatedTask {
        job_name: job.to_string(),
        task_id,
        recoverable: false,
    })
}

/// Runs until the process ends: polls the ensemble for `task`'s errors and pushes each to the
/// task's server at `address`.
pub async fn push_errors(client: CoordClient, task: tf::CoordinatedTask, address: String) {
    let name = format!("/job:{}/task:{}", task.job_name, task.task_id);
    let mut told: Option<u64> = None;
    loop {
        let Some(incarnation) = connected(&client, &task).await else {
            tokio::time::sleep(LOOK_EVERY).await;
            continue;
        };
        if told == Some(incarnation) {
            // Already told; wait for the next process.
            tokio::time::sleep(LOOK_EVERY).await;
            continue;
        }
        let error = match poll(&client, &task).await {
            Ok(e) => e,
            Err(_) => {
                tokio::time::sleep(crate::client::jittered(LOOK_EVERY)).await;
                continue;
            }
        };
        // The poll ends when an error comes; push it only to the process it was meant for.
        if connected(&client, &task).await != Some(incarnation) {
            continue;
        }
        told = Some(incarnation);
        match push(&address, &error).await {
            Ok(()) => eprintln!(
                "coord-proxy: pushed to {name} at {address}: {}",
                error.message()
            ),
            Err(e) => eprintln!(
                "coord-proxy: could not push to {name} at {address} ({}); it learns of the error at its next heartbeat",
                e.message()
            ),
        }
    }
}

/// The task's incarnation if it is connected.
async fn connected(client: &CoordClient, task: &tf::CoordinatedTask) -> Option<u64> {
    let states = client.task_states(std::slice::from_ref(task)).await.ok()?;
    states
        .tasks
        .into_iter()
        .find(|s| s.state == tf::CoordinatedTaskState::TaskstateConnected as i32)
        .map(|s| s.incarnation)
}

/// TensorFlow's PollForError for `task`: ends with the first error the task must learn of since
/// it registered (the ensemble's answer, with its payload), or with a failure of the call.
async fn poll(client: &CoordClient, task: &tf::CoordinatedTask) -> Result<Status, Status> {
    let req = tf::PollForErrorRequest {
        source_task: Some(task.clone()),
    };
    let answer = client
        .forward(req, false, true, |ch, r| async move {
            CoordinationServiceClient::new(ch).poll_for_error(r).await
        })
        .await;
    match answer {
        Ok(_) => Err(Status::internal("PollForError ended without an error")),
        Err(s) if s.code() != Code::Ok && coordination_error(s.details()).is_some() => Ok(s),
        Err(s) => Err(s),
    }
}

/// `ReportErrorToTask` to the task's server, as TensorFlow's service sends it.
async fn push(address: &str, error: &Status) -> Result<(), Status> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| Status::invalid_argument(format!("task address {address:?}: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10));
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Status::unavailable(format!("connect to {address}: {e}")))?;
    let payload = coordination_error(error.details());
    // The message as it was committed: TF's agent prefixes "Error reported from <task>" itself.
    let message = error
        .message()
        .split_once(": ")
        .filter(|(head, _)| head.starts_with("Error reported from "))
        .map_or(error.message(), |(_, rest)| rest)
        .to_string();
    CoordinationServiceClient::new(channel)
        .report_error_to_task(tf::ReportErrorToTaskRequest {
            error_code: error.code() as i32,
            error_message: message,
            error_payload: payload,
        })
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_job_colon_index() {
        let t = parse_task("worker:1").expect("parses");
        assert_eq!((t.job_name.as_str(), t.task_id), ("worker", 1));
        assert!(parse_task("worker").is_err());
        assert!(parse_task("worker:-1").is_err());
        assert!(parse_task(":1").is_err());
        assert!(parse_task("worker:x").is_err());
    }
}

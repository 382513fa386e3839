//! The coordination service through [`CoordClient`]: the task lifecycle (register, heartbeat,
//! WaitForAllTasks, reset, shutdown), barriers, errors and task states.
//!
//! Every mutation carries a request id; the calls that wait on the service (WaitForAllTasks,
//! barriers, ShutdownTask, error polling) have no attempt timeout.

use std::time::Duration;

use coord_proto::coord::coordination::coordination_client::CoordinationClient;
use coord_proto::coord::coordination::{
    AwaitAliveRequest, AwaitBarrierRequest, BarrierAnswer, BarrierArrivalsRequest, Beat,
    BeatAnswer, GetTaskStateRequest, GetTaskStateResponse, HeartbeatsRequest, PollForErrorRequest,
    PollForErrorResponse, WaitForAllTasksArrivalsRequest, XlaAliveArrivalsRequest,
    XlaAliveAsksRequest, XlaBarrierArrivalsRequest,
};
use coord_proto::tensorflow as tf;
use coord_proto::xla::coordination as xla;
use tonic::Status;

use super::{tf_client, CoordClient};

/// Largest answer of the whole job read: 100,000 tasks' GetAliveTasks answer is about 1.3 MB.
const ANSWER_LIMIT: usize = 64 << 20;

impl CoordClient {
    /// Registers `task`; returns the service incarnation.
    pub async fn register_task(
        &self,
        task: &tf::CoordinatedTask,
        incarnation: u64,
    ) -> Result<u64, Status> {
        let req = tf::RegisterTaskRequest {
            incarnation,
            source_task: Some(task.clone()),
        };
        let resp = self
            .mutate(
                req,
                |ch, r| async move { tf_client(ch).register_task(r).await },
            )
            .await?;
        Ok(resp.leader_incarnation)
    }

    /// One heartbeat; returns the service incarnation.
    pub async fn heartbeat(
        &self,
        task: &tf::CoordinatedTask,
        incarnation: u64,
    ) -> Result<u64, Status> {
        let req = tf::HeartbeatRequest {
            incarnation,
            source_task: Some(task.clone()),
        };
        let resp = self
            .call(req, None, |ch, r| async move {
                tf_client(ch).heartbeat(r).await
            })
            .await?;
        Ok(resp.leader_incarnation)
    }

    /// Several tasks' heartbeats in one call (as a sidecar carrying them sends them, see
    /// `proxy::beats`); one answer per beat, in order.
    pub async fn heartbeats(&self, beats: Vec<Beat>) -> Result<Vec<BeatAnswer>, Status> {
        let req = HeartbeatsRequest { beats };
        let resp = self
            .call(req, None, |ch, r| async move {
                CoordinationClient::new(ch).heartbeats(r).await
            })
            .await?;
        Ok(resp.answers)
    }

    /// Several tasks' Barrier arrivals in one call, recorded without waiting (as a sidecar carrying
    /// them sends them, see `proxy::barriers`); one answer per arrival, in order: its call's
    /// outcome, or pending while its instance waits for others ([`Self::await_barrier`]).
    pub async fn barrier_arrivals(
        &self,
        arrivals: Vec<tf::BarrierRequest>,
    ) -> Result<Vec<BarrierAnswer>, Status> {
        let req = BarrierArrivalsRequest { arrivals };
        let resp = self
            .mutate(req, |ch, r| async move {
                CoordinationClient::new(ch).barrier_arrivals(r).await
            })
            .await?;
        Ok(resp.answers)
    }

    /// Several of jaxlib's Barrier arrivals in one call, recorded without waiting, answered as
    /// [`Self::barrier_arrivals`] answers TensorFlow's.
    pub async fn xla_barrier_arrivals(
        &self,
        arrivals: Vec<xla::BarrierRequest>,
    ) -> Result<Vec<BarrierAnswer>, Status> {
        let req = XlaBarrierArrivalsRequest { arrivals };
        let resp = self
            .mutate(req, |ch, r| async move {
                CoordinationClient::new(ch).xla_barrier_arrivals(r).await
            })
            .await?;
        Ok(resp.answers)
    }

    /// Several of jaxlib's GetAliveTasks calls in one call, recorded without waiting, each under
    /// a request number of its own (so that one sent again after a leader change is recorded
    /// once): one answer per arrival, in order: the task's own error, or the round of its set it
    /// joined (`counter`), which [`Self::await_alive`] waits on.
    pub async fn xla_alive_arrivals(
        &self,
        arrivals: Vec<xla::GetAliveTasksRequest>,
    ) -> Result<Vec<BarrierAnswer>, Status> {
        let (tickets, call) = self.tickets(arrivals.len());
        let req = XlaAliveArrivalsRequest {
            arrival_seqs: tickets.iter().map(|t| t.id.seq).collect(),
            arrivals,
        };
        // Without an attempt timeout, as each task's own GetAliveTasks call is forwarded: every
        // ask lists the whole job, and a sidecar's asks are many such lists for the leader to read
        // (at 20,000 tasks, 100 asks a sidecar, the 2 s attempt timeout expired and every re-send
        // was read again).
        let resp = self
            .call_parked(req, Some(&call), |ch, r| async move {
                CoordinationClient::new(ch).xla_alive_arrivals(r).await
            })
            .await;
        drop((tickets, call));
        Ok(resp?.answers)
    }

    /// As [`Self::xla_alive_arrivals`], each set asked about sent once (`req` as coord-proxy
    /// builds it, its `ask_seqs` left to this client).
    pub async fn xla_alive_asks(
        &self,
        mut req: XlaAliveAsksRequest,
    ) -> Result<Vec<BarrierAnswer>, Status> {
        let (tickets, call) = self.tickets(req.asks.len());
        req.ask_seqs = tickets.iter().map(|t| t.id.seq).collect();
        // Without an attempt timeout, as XlaAliveArrivals.
        let resp = self
            .call_parked(req, Some(&call), |ch, r| async move {
                CoordinationClient::new(ch).xla_alive_asks(r).await
            })
            .await;
        drop((tickets, call));
        Ok(resp?.answers)
    }

    /// Waits for round `generation` of GetAliveTasks over `task_ids`: the answer each task of the
    /// round gets from its own call (gzip accepted: the replicas compress it once).
    pub async fn await_alive(
        &self,
        task_ids: Vec<i32>,
        generation: i64,
    ) -> Result<xla::GetAliveTasksResponse, Status> {
        let req = AwaitAliveRequest {
            task_ids,
            generation,
        };
        self.forward(req, false, true, |ch, r| async move {
            CoordinationClient::new(ch)
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip)
                .max_decoding_message_size(ANSWER_LIMIT)
                .await_alive(r)
                .await
        })
        .await
    }

    /// Several tasks' WaitForAllTasks arrivals in one call, recorded without waiting (see
    /// `proxy::barriers`); one answer per arrival, in order: the task's own error, or OK once
    /// the job has gathered, or pending.
    pub async fn wait_for_all_arrivals(
        &self,
        arrivals: Vec<tf::WaitForAllTasksRequest>,
    ) -> Result<Vec<BarrierAnswer>, Status> {
        let req = WaitForAllTasksArrivalsRequest { arrivals };
        let resp = self
            .mutate(req, |ch, r| async move {
                CoordinationClient::new(ch)
                    .wait_for_all_tasks_arrivals(r)
                    .await
            })
            .await?;
        Ok(resp.answers)
    }

    /// Waits until instance `counter` of barrier `id` has an outcome; the answer of every task
    /// waiting there.
    pub async fn await_barrier(&self, id: &str, counter: i64) -> Result<BarrierAnswer, Status> {
        let req = AwaitBarrierRequest {
            barrier_id: id.to_string(),
            counter,
        };
        self.call_parked(req, None, |ch, r| async move {
            CoordinationClient::new(ch).await_barrier(r).await
        })
        .await
    }

    /// Waits until every task has called this; returns the cluster's devices.
    pub async fn wait_for_all_tasks(
        &self,
        task: &tf::CoordinatedTask,
        devices: Option<tf::CoordinationServiceDeviceInfo>,
    ) -> Result<tf::WaitForAllTasksResponse, Status> {
        let req = tf::WaitForAllTasksRequest {
            local_device_info: devices,
            source_task: Some(task.clone()),
            device_info: None,
        };
        self.mutate_parked(req, |ch, r| async move {
            tf_client(ch).wait_for_all_tasks(r).await
        })
        .await
    }

    /// Waits at barrier `id` (instance `counter`); `tasks` empty = every task. Returns the
    /// instance's counter.
    pub async fn barrier(
        &self,
        id: &str,
        counter: i64,
        timeout: Duration,
        tasks: &[tf::CoordinatedTask],
        source: &tf::CoordinatedTask,
    ) -> Result<i64, Status> {
        let req = tf::BarrierRequest {
            barrier_id: id.to_string(),
            barrier_timeout_in_ms: i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX),
            tasks: tasks.to_vec(),
            source_task: Some(source.clone()),
            counter,
        };
        let resp = self
            .mutate_parked(req, |ch, r| async move { tf_client(ch).barrier(r).await })
            .await?;
        Ok(resp.counter)
    }

    pub async fn cancel_barrier(
        &self,
        id: &str,
        counter: i64,
        source: &tf::CoordinatedTask,
    ) -> Result<(), Status> {
        let req = tf::CancelBarrierRequest {
            barrier_id: id.to_string(),
            source_task: Some(source.clone()),
            counter,
        };
        self.mutate(
            req,
            |ch, r| async move { tf_client(ch).cancel_barrier(r).await },
        )
        .await
        .map(|_| ())
    }

    pub async fn report_error(
        &self,
        task: &tf::CoordinatedTask,
        code: i32,
        message: &str,
    ) -> Result<(), Status> {
        let req = tf::ReportErrorToServiceRequest {
            error_code: code,
            error_message: message.to_string(),
            error_origin: Some(task.clone()),
        };
        self.mutate(req, |ch, r| async move {
            tf_client(ch).report_error_to_service(r).await
        })
        .await
        .map(|_| ())
    }

    pub async fn reset_task(&self, task: &tf::CoordinatedTask) -> Result<(), Status> {
        let req = tf::ResetTaskRequest {
            source_task: Some(task.clone()),
        };
        self.mutate(
            req,
            |ch, r| async move { tf_client(ch).reset_task(r).await },
        )
        .await
        .map(|_| ())
    }

    pub async fn shutdown_task(&self, task: &tf::CoordinatedTask) -> Result<(), Status> {
        let req = tf::ShutdownTaskRequest {
            source_task: Some(task.clone()),
        };
        self.mutate_parked(
            req,
            |ch, r| async move { tf_client(ch).shutdown_task(r).await },
        )
        .await
        .map(|_| ())
    }

    /// Waits for the first error after `after_seq` that `task` must learn of.
    pub async fn poll_for_error(
        &self,
        task: &tf::CoordinatedTask,
        after_seq: u64,
    ) -> Result<PollForErrorResponse, Status> {
        let req = PollForErrorRequest {
            task: Some(task.clone()),
            after_seq,
        };
        self.call_parked(req, None, |ch, r| async move {
            CoordinationClient::new(ch).poll_for_error(r).await
        })
        .await
    }

    /// The states of `tasks` (every task if empty).
    pub async fn task_states(
        &self,
        tasks: &[tf::CoordinatedTask],
    ) -> Result<GetTaskStateResponse, Status> {
        let req = GetTaskStateRequest {
            tasks: tasks.to_vec(),
        };
        self.call(req, None, |ch, r| async move {
            CoordinationClient::new(ch).get_task_state(r).await
        })
        .await
    }
}

//! The conformance script of TensorFlow 2.21's `tensorflow.CoordinationService`: every RPC of the
//! schema, called with a client built from that schema (no agent in between), against TensorFlow's
//! own service and against the ensemble, one outcome line per call to compare.
//!
//! Job `worker` has three tasks. Task 0 is a real TensorFlow process
//! (`tests/tf/coordination_host.py`): against TensorFlow's own service it hosts the service, as
//! MWMS's leader does; against the ensemble it is a plain TF task whose leader is the ensemble. Its
//! agent registers, waits for all tasks and heartbeats as TensorFlow's agent does. This script
//! plays tasks 1 and 2, each on its own connection.
//!
//! An outcome is the answer with what differs by nature taken out: incarnations become whether
//! they are the service's incarnation seen at registration, errors become their gRPC code name and
//! their TensorFlow payloads (decoded from `grpc-status-details-bin`), never their message text.

use std::time::Duration;

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Status;

mod calls;
mod outcome;
mod phases;

/// Tasks 1 and 2 of job `worker` (task 0 is the TensorFlow process).
pub const TASKS: [i32; 2] = [1, 2];

fn task(id: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: id,
        recoverable: false,
    }
}

/// A connection to `addr`, retried while nothing listens there yet (TensorFlow takes seconds to
/// import and start its server).
async fn connect(addr: &str) -> Channel {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let endpoint = Channel::from_shared(format!("http://{addr}")).expect("endpoint");
        match endpoint
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
        {
            Ok(channel) => return channel,
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "nothing serves {addr}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs the script against the service at `addr`; one outcome per call, in order.
pub async fn run(addr: &str) -> Vec<Value> {
    let mut clients = Vec::new();
    for _ in TASKS {
        clients.push(CoordinationServiceClient::new(connect(addr).await));
    }
    let mut s = Script {
        clients,
        incarnations: [0x1111_0001, 0x2222_0002],
        service: 0,
        log: Vec::new(),
    };
    s.tasks().await;
    s.key_values().await;
    s.barriers().await;
    s.errors_and_exits().await;
    s.log
}

struct Script {
    clients: Vec<CoordinationServiceClient<Channel>>,
    incarnations: [u64; 2],
    /// The service's incarnation, as registration answered it.
    service: u64,
    log: Vec<Value>,
}

impl Script {
    fn c(&self, t: i32) -> CoordinationServiceClient<Channel> {
        self.clients[(t - 1) as usize].clone()
    }

    fn inc(&self, t: i32) -> u64 {
        self.incarnations[(t - 1) as usize]
    }

    fn record(&mut self, step: &str, t: i32, outcome: Value) {
        let mut line = json!({"step": step, "task": t});
        if let (Some(line), Some(o)) = (line.as_object_mut(), outcome.as_object()) {
            line.extend(o.clone());
        }
        eprintln!("{line}");
        self.log.push(line);
    }

    /// What a leader incarnation is: zero, the service's (as registration answered it), or
    /// another.
    fn incarnation(&self, l: u64) -> &'static str {
        match l {
            0 => "zero",
            l if l == self.service => "the service's",
            _ => "another",
        }
    }

    fn leader(&self, l: u64) -> Value {
        json!({"ok": {"leader_incarnation": self.incarnation(l)}})
    }
}

/// GetTaskState of a task outside the cluster, which the script does not ask of TensorFlow's
/// service (it kills that process): the error, with its message.
pub async fn unknown_task_state(addr: &str) -> Status {
    let mut c = CoordinationServiceClient::new(connect(addr).await);
    c.get_task_state(tf::GetTaskStateRequest {
        source_task: vec![task(9)],
    })
    .await
    .expect_err("a task outside the cluster has no state")
}

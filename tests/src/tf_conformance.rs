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
use coord_proto::tensorflow::distributed_runtime::GrpcPayloadContainer;
use prost::Message;
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

const COORDINATION_ERROR: &str = "type.googleapis.com/tensorflow.CoordinationServiceError";
const BARRIER_ERROR: &str = "type.googleapis.com/tensorflow.BarrierError";

/// Tasks 1 and 2 of job `worker` (task 0 is the TensorFlow process).
pub const TASKS: [i32; 2] = [1, 2];

fn task(id: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: id,
        recoverable: false,
    }
}

/// gRPC's name of a code, as TensorFlow and every gRPC library print it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

fn task_name(t: &Option<tf::CoordinatedTask>) -> Value {
    match t {
        Some(t) => json!(format!("/job:{}/task:{}", t.job_name, t.task_id)),
        None => Value::Null,
    }
}

/// An error: its code, and the TensorFlow payloads it carries. A call that ends at its caller's
/// deadline ends DEADLINE_EXCEEDED or CANCELLED, whichever side's timer wins (TensorFlow's own
/// service answers either, from one run to the next): both are `CALLER_DEADLINE`.
fn error_outcome(s: &Status) -> Value {
    if matches!(s.code(), Code::DeadlineExceeded | Code::Cancelled) && s.details().is_empty() {
        return json!({"err": "CALLER_DEADLINE", "payloads": {}});
    }
    let mut payloads = serde_json::Map::new();
    if let Ok(container) = GrpcPayloadContainer::decode(s.details()) {
        for (url, bytes) in container.payloads {
            let v = match url.as_str() {
                COORDINATION_ERROR => match tf::CoordinationServiceError::decode(&bytes[..]) {
                    Ok(e) => json!({
                        "is_reported_error": e.is_reported_error,
                        "source_task": task_name(&e.source_task),
                    }),
                    Err(_) => json!("undecodable"),
                },
                BARRIER_ERROR => match tf::BarrierError::decode(&bytes[..]) {
                    Ok(e) => json!({"barrier_id": e.barrier_id, "counter": e.counter}),
                    Err(_) => json!("undecodable"),
                },
                _ => json!("other"),
            };
            payloads.insert(url, v);
        }
    }
    json!({"err": code_name(s.code()), "payloads": payloads})
}

fn states(infos: &[tf::CoordinatedTaskStateInfo], service: u64) -> Value {
    let mut out: Vec<Value> = infos
        .iter()
        .map(|i| {
            let state = tf::CoordinatedTaskState::try_from(i.state)
                .map(|s| s.as_str_name())
                .unwrap_or("invalid");
            json!({
                "task": task_name(&i.task),
                "state": state,
                "error_code": i.error_code,
                "has_incarnation": i.incarnation != 0 && i.incarnation != service,
                "error_payload": i.error_payload.as_ref().map(|p| json!({
                    "is_reported_error": p.is_reported_error,
                    "source_task": task_name(&p.source_task),
                })),
            })
        })
        .collect();
    out.sort_by_key(|v| v["task"].to_string());
    json!(out)
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

    async fn register(&mut self, step: &str, t: i32, incarnation: u64) {
        self.register_as(step, task(t), incarnation).await;
    }

    async fn register_as(&mut self, step: &str, who: tf::CoordinatedTask, incarnation: u64) {
        let t = who.task_id;
        let r = self
            .c(t)
            .register_task(tf::RegisterTaskRequest {
                incarnation,
                source_task: Some(who),
            })
            .await;
        let o = match r {
            Ok(r) => {
                if self.service == 0 {
                    self.service = r.get_ref().leader_incarnation;
                }
                self.leader(r.get_ref().leader_incarnation)
            }
            Err(e) => error_outcome(&e),
        };
        self.record(step, t, o);
    }

    async fn heartbeat(&mut self, step: &str, who: tf::CoordinatedTask, incarnation: u64) {
        let t = who.task_id;
        let r = self
            .c(1)
            .heartbeat(tf::HeartbeatRequest {
                incarnation,
                source_task: Some(who),
            })
            .await;
        let o = match r {
            Ok(r) => self.leader(r.get_ref().leader_incarnation),
            Err(e) => error_outcome(&e),
        };
        self.record(step, t, o);
    }

    async fn task_state(&mut self, step: &str, of: &[i32]) {
        let r = self
            .c(1)
            .get_task_state(tf::GetTaskStateRequest {
                source_task: of.iter().map(|t| task(*t)).collect(),
            })
            .await;
        let o = match r {
            Ok(r) => json!({"ok": states(&r.get_ref().task_state, self.service)}),
            Err(e) => error_outcome(&e),
        };
        self.record(step, 1, o);
    }

    /// Registration, heartbeats, WaitForAllTasks (which releases task 0) and the task queries.
    async fn tasks(&mut self) {
        self.register("register", 1, self.inc(1)).await;
        self.register("register", 2, self.inc(2)).await;
        self.register("register_again_same_incarnation", 1, self.inc(1))
            .await;
        self.heartbeat("heartbeat", task(1), self.inc(1)).await;
        self.heartbeat("heartbeat_unknown_task", task(7), 7).await;
        let other_job = tf::CoordinatedTask {
            job_name: "nosuchjob".into(),
            ..task(1)
        };
        self.heartbeat("heartbeat_unknown_job", other_job, 7).await;
        // Every task waits: task 0 (the TensorFlow process) is already waiting.
        let waits: Vec<_> = TASKS
            .iter()
            .map(|t| {
                let mut c = self.c(*t);
                let t = *t;
                tokio::spawn(async move {
                    c.wait_for_all_tasks(tf::WaitForAllTasksRequest {
                        source_task: Some(task(t)),
                        device_info: Some(tf::DeviceInfo { device: vec![] }),
                        local_device_info: None,
                    })
                    .await
                })
            })
            .collect();
        for (t, w) in TASKS.into_iter().zip(waits) {
            let o = match w.await.expect("join") {
                Ok(r) => {
                    let r = r.into_inner();
                    let devices: Vec<String> = r
                        .device_info
                        .map(|d| d.device.into_iter().map(|a| a.type_url).collect())
                        .unwrap_or_default();
                    json!({"ok": {"leader_incarnation": self.incarnation(r.leader_incarnation),
                                  "devices": devices}})
                }
                Err(e) => error_outcome(&e),
            };
            self.record("wait_for_all_tasks", t, o);
        }
        self.task_state("task_state_all", &[0, 1, 2]).await;
        // Not asked: GetTaskState of a task outside the cluster. TensorFlow 2.21's own service
        // process dies of it (the call fails UNKNOWN, every later one UNAVAILABLE); the ensemble
        // answers INVALID_ARGUMENT naming the task (`unknown_task_state`, below).
        let r = self
            .c(1)
            .watch_job_state(tf::WatchJobStateRequest {
                job_name: "worker".into(),
                version_number: -1,
            })
            .await;
        let o = match r {
            Ok(r) => json!({"ok": states(&r.get_ref().task_state, self.service)}),
            Err(e) => error_outcome(&e),
        };
        self.record("watch_job_state", 1, o);
    }

    async fn kv<T: std::fmt::Debug>(
        &mut self,
        step: &str,
        t: i32,
        r: Result<tonic::Response<T>, Status>,
        ok: impl FnOnce(T) -> Value,
    ) {
        let o = match r {
            Ok(r) => json!({ "ok": ok(r.into_inner()) }),
            Err(e) => error_outcome(&e),
        };
        self.record(step, t, o);
    }

    async fn insert(&mut self, step: &str, t: i32, key: &str, value: &str, overwrite: bool) {
        let r = self
            .c(t)
            .insert_key_value(tf::InsertKeyValueRequest {
                kv: Some(tf::KeyValueEntry {
                    key: key.into(),
                    value: value.as_bytes().to_vec().into(),
                }),
                allow_overwrite: overwrite,
            })
            .await;
        self.kv(step, t, r, |_| json!(null)).await;
    }

    async fn try_get(&mut self, step: &str, t: i32, key: &str) {
        let r = self
            .c(t)
            .try_get_key_value(tf::TryGetKeyValueRequest { key: key.into() })
            .await;
        self.kv(step, t, r, |r| entry(r.kv)).await;
    }

    async fn increment(&mut self, step: &str, t: i32, key: &str, by: i64) {
        let r = self
            .c(t)
            .increment_key_value(tf::IncrementKeyValueRequest {
                key: key.into(),
                increment: by,
            })
            .await;
        self.kv(step, t, r, |r| entry(r.kv)).await;
    }

    async fn dir(&mut self, step: &str, t: i32, dir: &str) {
        let r = self
            .c(t)
            .get_key_value_dir(tf::GetKeyValueDirRequest {
                directory_key: dir.into(),
            })
            .await;
        self.kv(step, t, r, |r| {
            json!({"directory_key": r.directory_key,
                   "kv": r.kv.into_iter().map(|e| entry(Some(e))).collect::<Vec<_>>()})
        })
        .await;
    }

    async fn delete(&mut self, step: &str, t: i32, key: &str, is_directory: bool) {
        let r = self
            .c(t)
            .delete_key_value(tf::DeleteKeyValueRequest {
                key: key.into(),
                is_directory,
            })
            .await;
        self.kv(step, t, r, |_| json!(null)).await;
    }

    async fn key_values(&mut self) {
        self.insert("insert", 1, "conf/a/1", "v1", false).await;
        self.insert("insert", 2, "conf/a/2", "v2", false).await;
        self.insert("insert_existing", 1, "conf/a/1", "x", false)
            .await;
        self.insert("insert_overwrite", 1, "conf/a/1", "v1b", true)
            .await;
        self.insert("insert_nested", 2, "conf/a/2/deep", "v3", false)
            .await;
        let r = self
            .c(2)
            .get_key_value(tf::GetKeyValueRequest {
                key: "conf/a/1".into(),
            })
            .await;
        self.kv("get", 2, r, |r| entry(r.kv)).await;
        // A get of a key that is set later: held until it is.
        let mut c = self.c(1);
        let held = tokio::spawn(async move {
            c.get_key_value(tf::GetKeyValueRequest {
                key: "conf/later".into(),
            })
            .await
        });
        self.insert("insert_awaited", 2, "conf/later", "now", false)
            .await;
        let r = held.await.expect("join");
        self.kv("get_held_until_set", 1, r, |r| entry(r.kv)).await;
        let mut req = Request::new(tf::GetKeyValueRequest {
            key: "conf/never".into(),
        });
        req.set_timeout(Duration::from_millis(300));
        let r = self.c(1).get_key_value(req).await;
        self.kv("get_never_set_deadline", 1, r, |r| entry(r.kv))
            .await;
        self.try_get("try_get", 1, "conf/a/2").await;
        self.try_get("try_get_missing", 1, "conf/missing").await;
        self.dir("dir", 1, "conf/a").await;
        self.dir("dir_trailing_slash", 1, "conf/a/").await;
        self.dir("dir_empty", 1, "conf/nothing").await;
        self.increment("increment_new", 1, "conf/ctr", 5).await;
        self.increment("increment", 2, "conf/ctr", -2).await;
        self.try_get("counter_as_text", 2, "conf/ctr").await;
        self.increment("increment_not_a_number", 1, "conf/a/1", 1)
            .await;
        self.delete("delete", 1, "conf/a/1", false).await;
        self.try_get("try_get_deleted", 1, "conf/a/1").await;
        self.delete("delete_missing", 1, "conf/a/1", false).await;
        self.delete("delete_directory", 2, "conf/a", true).await;
        self.dir("dir_after_delete", 2, "conf/a").await;
        self.try_get("try_get_nested_deleted", 2, "conf/a/2/deep")
            .await;
    }

    async fn barrier(
        &mut self,
        id: &str,
        t: i32,
        members: &[i32],
        timeout_ms: i64,
        counter: i64,
    ) -> Result<i64, Status> {
        self.c(t)
            .barrier(tf::BarrierRequest {
                barrier_id: id.into(),
                barrier_timeout_in_ms: timeout_ms,
                tasks: members.iter().map(|m| task(*m)).collect(),
                source_task: Some(task(t)),
                counter,
            })
            .await
            .map(|r| r.into_inner().counter)
    }

    /// Both scripted tasks at barrier `id` at once; their outcomes in task order.
    async fn both_at(&mut self, step: &str, id: &str, counter: i64) {
        let calls: Vec<_> = TASKS
            .iter()
            .map(|t| {
                let mut c = self.c(*t);
                let req = tf::BarrierRequest {
                    barrier_id: id.into(),
                    barrier_timeout_in_ms: 30_000,
                    tasks: TASKS.iter().map(|m| task(*m)).collect(),
                    source_task: Some(task(*t)),
                    counter,
                };
                tokio::spawn(async move { c.barrier(req).await })
            })
            .collect();
        for (t, call) in TASKS.into_iter().zip(calls) {
            let r = call.await.expect("join");
            self.kv(step, t, r, |r| json!({"counter": r.counter})).await;
        }
    }

    async fn cancel(&mut self, step: &str, t: i32, id: &str, counter: i64) {
        let r = self
            .c(t)
            .cancel_barrier(tf::CancelBarrierRequest {
                barrier_id: id.into(),
                counter,
                source_task: Some(task(t)),
            })
            .await;
        self.kv(step, t, r, |_| json!(null)).await;
    }

    async fn barriers(&mut self) {
        self.both_at("barrier", "conf/b", 0).await;
        self.both_at("barrier_next_counter", "conf/b", 1).await;
        let o = outcome(self.barrier("conf/b", 1, &[1, 2], 30_000, 0).await);
        self.record("barrier_passed_counter_again", 1, o);
        let o = outcome(self.barrier("conf/solo", 1, &[2], 1_000, 0).await);
        self.record("barrier_not_a_member", 1, o);
        let o = outcome(self.barrier("conf/timeout", 1, &[1, 2], 300, 0).await);
        self.record("barrier_times_out", 1, o);
        let o = outcome(self.barrier("conf/timeout", 2, &[1, 2], 300, 0).await);
        self.record("barrier_after_its_timeout", 2, o);
        // A barrier cancelled by a member while another waits.
        let mut c = self.c(1);
        let waiting = tokio::spawn(async move {
            c.barrier(tf::BarrierRequest {
                barrier_id: "conf/cancelled".into(),
                barrier_timeout_in_ms: 30_000,
                tasks: TASKS.iter().map(|m| task(*m)).collect(),
                source_task: Some(task(1)),
                counter: 0,
            })
            .await
        });
        // Give the waiting call time to arrive. Should it arrive after the cancel instead, the
        // outcomes are the same (a barrier cancelled before anyone came fails whoever comes
        // with CANCELLED), so the comparison does not depend on this pause.
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.cancel("cancel_barrier", 2, "conf/cancelled", 0).await;
        let r = waiting.await.expect("join");
        self.kv("barrier_cancelled", 1, r, |r| json!({"counter": r.counter}))
            .await;
        self.cancel("cancel_passed_barrier", 1, "conf/b", 0).await;
        self.cancel("cancel_unknown_barrier", 1, "conf/nobarrier", 0)
            .await;
        // GetAliveTasks: both at once.
        let calls: Vec<_> = TASKS
            .iter()
            .map(|t| {
                let mut c = self.c(*t);
                let req = tf::GetAliveTasksRequest {
                    requesting_task: Some(task(*t)),
                    tasks: TASKS.iter().map(|m| task(*m)).collect(),
                };
                tokio::spawn(async move { c.get_alive_tasks(req).await })
            })
            .collect();
        for (t, call) in TASKS.into_iter().zip(calls) {
            let r = call.await.expect("join");
            // In no particular order: TensorFlow's comes from a hash set.
            self.kv("get_alive_tasks", t, r, |r| {
                let mut alive: Vec<Value> = r
                    .alive_tasks
                    .iter()
                    .map(|a| task_name(&Some(a.clone())))
                    .collect();
                alive.sort_by_key(|v| v.to_string());
                json!({"alive": alive, "incarnations": r.incarnations.len()})
            })
            .await;
        }
    }

    /// Errors reported to the service, their effect on every task, reset, and shutdown.
    async fn errors_and_exits(&mut self) {
        let mut req = Request::new(tf::PollForErrorRequest {
            source_task: Some(task(1)),
        });
        req.set_timeout(Duration::from_millis(300));
        let r = self.c(1).poll_for_error(req).await;
        self.kv("poll_for_error_nothing_yet", 1, r, |_| json!(null))
            .await;
        let r = self
            .c(2)
            .report_error_to_service(tf::ReportErrorToServiceRequest {
                error_code: Code::Internal as i32,
                error_message: "conformance: task 2 failed".into(),
                error_origin: Some(task(2)),
            })
            .await;
        self.kv("report_error_to_service", 2, r, |_| json!(null))
            .await;
        self.task_state("task_state_after_error", &[1, 2]).await;
        self.heartbeat("heartbeat_of_the_failed_task", task(2), self.inc(2))
            .await;
        let o = outcome(self.barrier("conf/after", 1, &[1, 2], 1_000, 0).await);
        self.record("barrier_with_a_failed_member", 1, o);
        let r = self
            .c(2)
            .reset_task(tf::ResetTaskRequest {
                source_task: Some(task(2)),
            })
            .await;
        self.kv("reset_task", 2, r, |_| json!(null)).await;
        self.task_state("task_state_after_reset", &[2]).await;
        self.register("register_after_reset", 2, self.inc(2) + 1)
            .await;
        // Task 2's failure, above: the ensemble answers task 1's heartbeats with it (that is how
        // TF 2.21's agents learn of it here), where TensorFlow's service pushes it.
        self.heartbeat("heartbeat_after_another_task_failed", task(1), self.inc(1))
            .await;
        // A task that says it is recoverable restarts without failing, and fails alone.
        let recoverable = tf::CoordinatedTask {
            recoverable: true,
            ..task(2)
        };
        self.register_as(
            "register_recoverable_restarted",
            recoverable.clone(),
            self.inc(2) + 2,
        )
        .await;
        let r = self
            .c(2)
            .report_error_to_service(tf::ReportErrorToServiceRequest {
                error_code: Code::Internal as i32,
                error_message: "conformance: recoverable task 2 failed".into(),
                error_origin: Some(recoverable.clone()),
            })
            .await;
        self.kv("report_error_recoverable", 2, r, |_| json!(null))
            .await;
        self.task_state("task_state_recoverable_error", &[2]).await;
        // Out of a reported error (not a lost connection) only through a reset, recoverable or not.
        self.register_as(
            "register_recoverable_out_of_an_error",
            recoverable,
            self.inc(2) + 3,
        )
        .await;
        let r = self
            .c(1)
            .shutdown_task(tf::ShutdownTaskRequest {
                source_task: Some(task(1)),
            })
            .await;
        self.kv("shutdown_task", 1, r, |_| json!(null)).await;
        self.task_state("task_state_after_shutdown", &[1]).await;
        self.heartbeat("heartbeat_after_shutdown", task(1), self.inc(1))
            .await;
        // What a service sends an agent; sent here to the service's own address.
        let r = self
            .c(2)
            .report_error_to_task(tf::ReportErrorToTaskRequest {
                error_code: Code::Internal as i32,
                error_message: "conformance: pushed to the service's address".into(),
                error_payload: Some(tf::CoordinationServiceError {
                    is_reported_error: false,
                    source_task: Some(task(2)),
                }),
            })
            .await;
        self.kv("report_error_to_task", 2, r, |_| json!(null)).await;
    }
}

fn outcome(r: Result<i64, Status>) -> Value {
    match r {
        Ok(counter) => json!({"ok": {"counter": counter}}),
        Err(e) => error_outcome(&e),
    }
}

fn entry(kv: Option<tf::KeyValueEntry>) -> Value {
    match kv {
        Some(e) => json!([e.key, String::from_utf8_lossy(&e.value)]),
        None => Value::Null,
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

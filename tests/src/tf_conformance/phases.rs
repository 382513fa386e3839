//! The script itself, in the order it runs: tasks, key-values, barriers, errors and exits.

use std::time::Duration;

use serde_json::{json, Value};
use tonic::{Code, Request};

use super::outcome::{entry, error_outcome, outcome, states, task_name};
use super::{task, tf, Script, TASKS};

impl Script {
    /// Registration, heartbeats, WaitForAllTasks (which releases task 0) and the task queries.
    pub(super) async fn tasks(&mut self) {
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

    pub(super) async fn key_values(&mut self) {
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

    pub(super) async fn barriers(&mut self) {
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
    pub(super) async fn errors_and_exits(&mut self) {
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

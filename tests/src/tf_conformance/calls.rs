//! The script's calls, one per RPC shape: each makes the call as task `t` and records its
//! outcome.

use serde_json::{json, Value};
use tonic::Status;

use super::outcome::{entry, error_outcome, states};
use super::{task, tf, Script, TASKS};

impl Script {
    pub(super) async fn register(&mut self, step: &str, t: i32, incarnation: u64) {
        self.register_as(step, task(t), incarnation).await;
    }

    pub(super) async fn register_as(
        &mut self,
        step: &str,
        who: tf::CoordinatedTask,
        incarnation: u64,
    ) {
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

    pub(super) async fn heartbeat(
        &mut self,
        step: &str,
        who: tf::CoordinatedTask,
        incarnation: u64,
    ) {
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

    pub(super) async fn task_state(&mut self, step: &str, of: &[i32]) {
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

    pub(super) async fn kv<T: std::fmt::Debug>(
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

    pub(super) async fn insert(
        &mut self,
        step: &str,
        t: i32,
        key: &str,
        value: &str,
        overwrite: bool,
    ) {
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

    pub(super) async fn try_get(&mut self, step: &str, t: i32, key: &str) {
        let r = self
            .c(t)
            .try_get_key_value(tf::TryGetKeyValueRequest { key: key.into() })
            .await;
        self.kv(step, t, r, |r| entry(r.kv)).await;
    }

    pub(super) async fn increment(&mut self, step: &str, t: i32, key: &str, by: i64) {
        let r = self
            .c(t)
            .increment_key_value(tf::IncrementKeyValueRequest {
                key: key.into(),
                increment: by,
            })
            .await;
        self.kv(step, t, r, |r| entry(r.kv)).await;
    }

    pub(super) async fn dir(&mut self, step: &str, t: i32, dir: &str) {
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

    pub(super) async fn delete(&mut self, step: &str, t: i32, key: &str, is_directory: bool) {
        let r = self
            .c(t)
            .delete_key_value(tf::DeleteKeyValueRequest {
                key: key.into(),
                is_directory,
            })
            .await;
        self.kv(step, t, r, |_| json!(null)).await;
    }

    pub(super) async fn barrier(
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
    pub(super) async fn both_at(&mut self, step: &str, id: &str, counter: i64) {
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

    pub(super) async fn cancel(&mut self, step: &str, t: i32, id: &str, counter: i64) {
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
}

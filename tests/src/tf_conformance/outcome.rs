//! Outcomes: an answer with what differs by nature between services taken out (see the module
//! above): gRPC code names, decoded TensorFlow payloads, task names.

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::distributed_runtime::{
    GrpcPayloadContainer, BARRIER_ERROR_URL as BARRIER_ERROR,
    COORDINATION_ERROR_URL as COORDINATION_ERROR,
};
use prost::Message;
use serde_json::{json, Value};
use tonic::{Code, Status};

pub(super) fn task_name(t: &Option<tf::CoordinatedTask>) -> Value {
    match t {
        Some(t) => json!(format!("/job:{}/task:{}", t.job_name, t.task_id)),
        None => Value::Null,
    }
}

/// An error: its code, and the TensorFlow payloads it carries. A call that ends at its caller's
/// deadline ends DEADLINE_EXCEEDED or CANCELLED, whichever side's timer wins (TensorFlow's own
/// service answers either, from one run to the next): both are `CALLER_DEADLINE`.
pub(super) fn error_outcome(s: &Status) -> Value {
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
    json!({"err": coord_proto::grpc_code_name(s.code()), "payloads": payloads})
}

pub(super) fn states(infos: &[tf::CoordinatedTaskStateInfo], service: u64) -> Value {
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

pub(super) fn outcome(r: Result<i64, Status>) -> Value {
    match r {
        Ok(counter) => json!({"ok": {"counter": counter}}),
        Err(e) => error_outcome(&e),
    }
}

pub(super) fn entry(kv: Option<tf::KeyValueEntry>) -> Value {
    match kv {
        Some(e) => json!([e.key, String::from_utf8_lossy(&e.value)]),
        None => Value::Null,
    }
}

//! Conversions between TensorFlow's wire types and the state machine's, in one place.

use coord_proto::tensorflow as tf;
use coord_raft_store::state::{DeviceInfo, TaskError, TaskName, TaskState};

use crate::error::CoordError;

/// The task a request names in `field`; a missing task or a negative id is INVALID_ARGUMENT.
pub fn task_from(t: Option<&tf::CoordinatedTask>, field: &str) -> Result<TaskName, CoordError> {
    let t = t.ok_or_else(|| CoordError::InvalidArgument(format!("{field} is missing")))?;
    let id = u32::try_from(t.task_id).map_err(|_| {
        CoordError::InvalidArgument(format!(
            "{field}: task id {} of job {:?} is negative",
            t.task_id, t.job_name
        ))
    })?;
    Ok(TaskName::new(t.job_name.clone(), id))
}

/// Every task of a request's list, validated the same way.
pub fn tasks_from(list: &[tf::CoordinatedTask], field: &str) -> Result<Vec<TaskName>, CoordError> {
    list.iter().map(|t| task_from(Some(t), field)).collect()
}

pub fn task_to(t: &TaskName) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: t.job.clone(),
        task_id: i32::try_from(t.task).unwrap_or(i32::MAX),
        recoverable: false,
    }
}

pub fn state_to(s: TaskState) -> tf::CoordinatedTaskState {
    match s {
        TaskState::Disconnected => tf::CoordinatedTaskState::TaskstateDisconnected,
        TaskState::Connected => tf::CoordinatedTaskState::TaskstateConnected,
        TaskState::Error => tf::CoordinatedTaskState::TaskstateError,
    }
}

/// TensorFlow's error payload for an error that happened in `e.source`.
pub fn error_payload(e: &TaskError) -> tf::CoordinationServiceError {
    tf::CoordinationServiceError {
        is_reported_error: e.reported,
        source_task: Some(task_to(&e.source)),
    }
}

/// The device info a WaitForAllTasks request carries (none = an empty TF list).
pub fn devices_from(info: Option<&tf::CoordinationServiceDeviceInfo>) -> DeviceInfo {
    match info.and_then(|i| i.r#type.as_ref()) {
        Some(tf::coordination_service_device_info::Type::Xla(x)) => {
            DeviceInfo::Xla(x.devices.clone())
        }
        Some(tf::coordination_service_device_info::Type::Tf(t)) => {
            DeviceInfo::Tf(t.devices.clone())
        }
        None => DeviceInfo::Tf(Vec::new()),
    }
}

/// The whole cluster's devices, in task order, in the kind the caller sent: TF device lists are
/// concatenated; XLA topologies are concatenated serialized `GlobalTopologyProto`s, which protobuf
/// merges into one message listing every task's nodes.
pub fn cluster_devices(like: &DeviceInfo, all: &[DeviceInfo]) -> tf::CoordinationServiceDeviceInfo {
    use tf::coordination_service_device_info::Type;
    let kind = match like {
        DeviceInfo::Tf(_) => Type::Tf(tf::TfDeviceList {
            devices: all
                .iter()
                .filter_map(|d| match d {
                    DeviceInfo::Tf(list) => Some(list.iter().cloned()),
                    DeviceInfo::Xla(_) => None,
                })
                .flatten()
                .collect(),
        }),
        DeviceInfo::Xla(_) => {
            let mut merged = Vec::new();
            for d in all {
                if let DeviceInfo::Xla(b) = d {
                    merged.extend_from_slice(b);
                }
            }
            Type::Xla(tf::XlaDeviceList {
                devices: merged.into(),
            })
        }
    };
    tf::CoordinationServiceDeviceInfo { r#type: Some(kind) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_validated() {
        let ok = tf::CoordinatedTask {
            job_name: "w".into(),
            task_id: 3,
            recoverable: false,
        };
        assert_eq!(
            task_from(Some(&ok), "source_task").ok(),
            Some(TaskName::new("w", 3))
        );
        let neg = tf::CoordinatedTask {
            job_name: "w".into(),
            task_id: -1,
            recoverable: false,
        };
        let e = task_from(Some(&neg), "source_task").expect_err("negative");
        assert!(e.to_string().contains("source_task: task id -1"));
        assert!(task_from(None, "source_task").is_err());
    }

    #[test]
    fn xla_topologies_concatenate() {
        let all = [
            DeviceInfo::Xla(bytes::Bytes::from_static(b"\x0a\x01a")),
            DeviceInfo::Xla(bytes::Bytes::from_static(b"\x0a\x01b")),
        ];
        let merged = cluster_devices(&all[0], &all);
        match merged.r#type {
            Some(tf::coordination_service_device_info::Type::Xla(x)) => {
                assert_eq!(x.devices.len(), 6)
            }
            other => panic!("{other:?}"),
        }
    }
}

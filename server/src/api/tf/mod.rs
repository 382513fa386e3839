//! The `tensorflow.CoordinationService` wire adapter, as TensorFlow 2.21's agents speak it
//! (the schema is TF 2.21's own; see `proto/protos/tensorflow/coordination_service.proto`). Like
//! [`crate::api::xla`], it only decodes, routes to the leader and encodes; the semantics are
//! [`KvCore`]'s and [`CoordCore`]'s, shared with jaxlib's surface.
//!
//! What TensorFlow's agents expect on the wire, beyond the calls themselves:
//! - every error the service itself produces carries a `CoordinationServiceError` payload (see
//!   [`crate::api::payloads`]): TF's agent keeps retrying RegisterTask on an error without one,
//!   and stops on one with it; barrier errors add a `BarrierError`;
//! - device info travels in `WaitForAllTasksRequest.device_info` (field 6) as `Any`-packed
//!   `DeviceAttributes`, and comes back in `WaitForAllTasksResponse.device_info` (field 4); the
//!   fields older releases used (4 and 3) are read and answered too;
//! - another task's failure reaches a task's agent as the answer to its next heartbeat (TF's own
//!   service pushes `ReportErrorToTask` to the task's server instead; coord knows no task
//!   addresses, and TF's agent treats a failed heartbeat the same way: it aborts its collectives);
//! - `PollForError` works as in TF's polling mode (a coordination service that cannot reach its
//!   agents): it parks until another task's error and ends with it.
//!
//! [`service`] holds the RPCs; this module the service's state and the helpers they share.

mod service;

use std::sync::{Arc, Mutex, PoisonError};

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_raft_store::state::{DeviceInfo, ErrorEvent};
use prost::Message;

use crate::api::payloads::{detailed_with, with_payloads};
use crate::api::wire::{cluster_devices, devices_from, error_payload};
use crate::error::{grpc_code, CoordError};
use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::coordination::CoordCore;
use crate::serve::kv::KvCore;
use crate::serve::route::Router;

/// The type URL TensorFlow packs each device's `DeviceAttributes` under.
const DEVICE_ATTRIBUTES_URL: &str = "type.googleapis.com/tensorflow.DeviceAttributes";

pub struct TfService {
    router: Arc<Router>,
    kv: Arc<KvCore>,
    coord: Arc<CoordCore>,
    /// The last cluster device info built for WaitForAllTasks, per device list and kind: a whole
    /// job released at once gets one copy built, not one per task.
    devices: Mutex<Option<DevicesReply>>,
}

struct DevicesReply {
    from: Arc<Vec<DeviceInfo>>,
    xla: bool,
    reply: tf::CoordinationServiceDeviceInfo,
}

impl TfService {
    pub fn new(router: Arc<Router>, kv: Arc<KvCore>, coord: Arc<CoordCore>) -> Self {
        Self {
            router,
            kv,
            coord,
            devices: Mutex::new(None),
        }
    }

    /// The whole cluster's devices in the older releases' form (see [`cluster_devices`]).
    fn cluster_devices(
        &self,
        mine: &DeviceInfo,
        all: &Arc<Vec<DeviceInfo>>,
    ) -> tf::CoordinationServiceDeviceInfo {
        let xla = matches!(mine, DeviceInfo::Xla(_));
        let mut cache = self.devices.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(c) = cache
            .as_ref()
            .filter(|c| Arc::ptr_eq(&c.from, all) && c.xla == xla)
        {
            return c.reply.clone();
        }
        let reply = cluster_devices(mine, all);
        *cache = Some(DevicesReply {
            from: all.clone(),
            xla,
            reply: reply.clone(),
        });
        reply
    }
}

fn client(ch: PeerChannel) -> CoordinationServiceClient<PeerChannel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

fn entry(key: String, value: bytes::Bytes) -> tf::KeyValueEntry {
    tf::KeyValueEntry { key, value }
}

/// Runs `f`, giving its service errors TensorFlow's payload.
async fn served<T>(
    f: impl std::future::Future<Output = Result<T, CoordError>>,
) -> Result<T, CoordError> {
    f.await.map_err(|e| detailed_with(e, None))
}

/// A registration refused ABORTED (a restart of a connected task, or a task in error): the
/// registering task named in the payload, as TensorFlow's service names it.
fn refused_registration(e: CoordError, task: &coord_raft_store::state::TaskName) -> CoordError {
    let aborted = matches!(
        &e,
        CoordError::Op(coord_raft_store::OpError::Status { code, .. })
            if *code == coord_raft_store::state::Code::Aborted
    );
    if !aborted {
        return e;
    }
    let payload = tf::CoordinationServiceError {
        is_reported_error: false,
        source_task: Some(crate::api::wire::task_to(task)),
    };
    with_payloads(
        tonic::Code::Aborted,
        e.to_string(),
        payload.encode_to_vec(),
        None,
    )
}

/// Another task's failure as an answer: its code and message, the failed task named in the
/// payload (what TF's agent gets from a pushed `ReportErrorToTask`).
fn propagated(e: &ErrorEvent) -> CoordError {
    with_payloads(
        grpc_code(e.error.code),
        format!(
            "Error reported from /job:{}/task:{}: {}",
            e.error.source.job, e.error.source.task, e.error.message
        ),
        error_payload(&e.error).encode_to_vec(),
        None,
    )
}

/// The device info of a WaitForAllTasks request: TF 2.21's `device_info` (field 6), else what
/// older releases sent (field 4), else none. Each 2.21 device is an `Any`-packed
/// `DeviceAttributes`; coord keeps the `DeviceAttributes` bytes as they came.
fn devices_of(req: &tf::WaitForAllTasksRequest) -> Result<DeviceInfo, CoordError> {
    match &req.device_info {
        Some(info) if !info.device.is_empty() => info
            .device
            .iter()
            .enumerate()
            .map(|(i, any)| {
                if any.type_url == DEVICE_ATTRIBUTES_URL {
                    Ok(any.value.clone())
                } else {
                    Err(CoordError::InvalidArgument(format!(
                        "device_info.device[{i}] is a {:?}; coord keeps device lists of {DEVICE_ATTRIBUTES_URL}",
                        any.type_url
                    )))
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(DeviceInfo::Tf),
        _ => Ok(devices_from(req.local_device_info.as_ref())),
    }
}

/// The cluster's devices in TF 2.21's form: every task's `DeviceAttributes`, packed again.
fn device_info_of(all: &[DeviceInfo]) -> tf::DeviceInfo {
    tf::DeviceInfo {
        device: all
            .iter()
            .filter_map(|d| match d {
                DeviceInfo::Tf(list) => Some(list.iter()),
                DeviceInfo::Xla(_) => None,
            })
            .flatten()
            .map(|value| tf::AnyMessage {
                type_url: DEVICE_ATTRIBUTES_URL.into(),
                value: value.clone(),
            })
            .collect(),
    }
}

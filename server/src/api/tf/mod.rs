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
//! [`service`] holds the RPCs, [`waits`] the two that park until the whole job arrives; this
//! module the service's state and the helpers they share.

mod relayed;
mod service;
mod waits;

use std::sync::{Arc, Mutex, PoisonError};

use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_raft_store::state::{DeviceInfo, ErrorEvent};
use prost::Message;

use crate::api::payloads::{detailed_with, with_payloads};
use crate::api::shared_answer::{AnswerBytes, Relayed, SharedAnswer};
use crate::api::value_answers::{carries_values, ValueAnswers};
use crate::api::wire::{cluster_devices, devices_from, error_payload};
use crate::error::{grpc_code, CoordError};
use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::coordination::CoordCore;
use crate::serve::kv::KvCore;
use crate::serve::route::Router;

carries_values!(
    single: tf::GetKeyValueResponse, tf::TryGetKeyValueResponse;
    dir: tf::GetKeyValueDirResponse
);

/// The type URL TensorFlow packs each device's `DeviceAttributes` under.
const DEVICE_ATTRIBUTES_URL: &str = "type.googleapis.com/tensorflow.DeviceAttributes";

pub struct TfService {
    /// Itself, for the futures of deferred calls (see `api::deferred`), which outlive a handler.
    me: std::sync::Weak<TfService>,
    router: Arc<Router>,
    kv: Arc<KvCore>,
    coord: Arc<CoordCore>,
    /// Large key-value answers, encoded once for every reader (see `api::value_answers`).
    values: ValueAnswers,
    /// The last device lists encoded for WaitForAllTasks answers: a whole job released at once
    /// gets each list encoded once, not once per task.
    answers: Mutex<Vec<EncodedDevices>>,
    /// Answers relayed from the leader, kept by their bytes.
    relayed: Relayed,
    /// The gatherings a follower's WaitForAllTasks callers wait on, each with one call on the
    /// leader (see `relayed`).
    gatherings: crate::api::relayed_waits::SharedWaits<
        (crate::serve::namespace::Ns, AnswerForm, i64),
        bytes::Bytes,
    >,
    /// A follower's callers of one GetKeyValue, answered by one read on the leader (see
    /// `api::relayed_reads`).
    reads: crate::api::relayed_reads::RelayedReads<tf::GetKeyValueRequest, tf::GetKeyValueResponse>,
}

/// How many encoded device lists [`TfService::answers`] keeps (a few namespaces' jobs released
/// at about the same time, each in the forms its clients asked for).
const ENCODED_KEPT: usize = 8;

/// The fields of a WaitForAllTasks answer that carry the job's devices, as one client form reads
/// them, encoded once for every task of the job.
struct EncodedDevices {
    from: Arc<Vec<DeviceInfo>>,
    form: AnswerForm,
    fields: bytes::Bytes,
    /// The whole answer with these fields, for the incarnation it was made for: what
    /// [`RewriteLayer`](crate::api::rewrite::RewriteLayer) sends to every caller.
    whole: Option<(u64, Arc<AnswerBytes>)>,
}

/// Which fields a caller reads the job's devices from, told by the fields it sent its own in.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum AnswerForm {
    /// TF 2.21 (`device_info`, field 6): the answer's field 4 only.
    Current,
    /// Older releases (`local_device_info`, field 4): the answer's field 3 only, in the kind the
    /// caller sent (TF device lists or XLA topologies).
    Older { xla: bool },
    /// Nothing sent: both fields, as either reader expects.
    Unknown,
}

impl AnswerForm {
    fn of(req: &tf::WaitForAllTasksRequest) -> Self {
        use tf::coordination_service_device_info::Type;
        match (&req.device_info, &req.local_device_info) {
            (Some(_), _) => Self::Current,
            (None, Some(old)) => Self::Older {
                xla: matches!(old.r#type, Some(Type::Xla(_))),
            },
            (None, None) => Self::Unknown,
        }
    }

    /// The job's devices as this form's fields, encoded.
    fn encode(self, all: &[DeviceInfo]) -> bytes::Bytes {
        use coord_proto::wait_answer::encoded_field;
        let older = |xla: bool| {
            let like = if xla {
                DeviceInfo::Xla(bytes::Bytes::new())
            } else {
                DeviceInfo::Tf(Vec::new())
            };
            encoded_field(3, &cluster_devices(&like, all))
        };
        match self {
            Self::Current => encoded_field(4, &device_info_of(all)),
            Self::Older { xla } => older(xla),
            Self::Unknown => {
                let mut both = older(false).to_vec();
                both.extend_from_slice(&encoded_field(4, &device_info_of(all)));
                both.into()
            }
        }
    }
}

impl TfService {
    pub fn new(router: Arc<Router>, kv: Arc<KvCore>, coord: Arc<CoordCore>) -> Arc<Self> {
        Arc::new_cyclic(|me| Self {
            me: me.clone(),
            router,
            kv,
            coord,
            values: ValueAnswers::default(),
            answers: Mutex::new(Vec::new()),
            relayed: Relayed::default(),
            gatherings: Default::default(),
            reads: Default::default(),
        })
    }

    /// This service, owned: what a deferred call's future holds (it outlives the handler).
    fn owned(&self) -> Result<Arc<Self>, tonic::Status> {
        crate::api::deferred::owned(&self.me)
    }

    /// The answer's device fields for `form`: encoded on the first call for this device list,
    /// shared by every later one. Past the answer limit it is RESOURCE_EXHAUSTED, naming it.
    fn device_fields(
        &self,
        form: AnswerForm,
        all: &Arc<Vec<DeviceInfo>>,
    ) -> Result<bytes::Bytes, CoordError> {
        let mut cache = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        let fields = match cache
            .iter()
            .find(|c| Arc::ptr_eq(&c.from, all) && c.form == form)
        {
            Some(c) => c.fields.clone(),
            None => {
                let fields = form.encode(all);
                if cache.len() >= ENCODED_KEPT {
                    cache.remove(0);
                }
                cache.push(EncodedDevices {
                    from: all.clone(),
                    form,
                    fields: fields.clone(),
                    whole: None,
                });
                fields
            }
        };
        within_answer_limit(fields, all.len(), ANSWER_LIMIT)
    }

    /// `answer` whole, encoded once for every caller that gets the same one: one built here with
    /// [`Self::device_fields`], or one relayed from the leader as its bytes (only `encoded`, which
    /// is then the whole message), shared by equal bytes (see [`Relayed`]).
    fn shared_answer(&self, answer: &tf::WaitForAllTasksResponse) -> Option<SharedAnswer> {
        if answer.encoded.is_empty() {
            return None;
        }
        let mut cache = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        let found = cache.iter_mut().find(|c| {
            c.fields.as_ptr() == answer.encoded.as_ptr() && c.fields.len() == answer.encoded.len()
        });
        let Some(entry) = found else {
            let whole = answer.leader_incarnation == 0
                && answer.device_info.is_none()
                && answer.cluster_device_info.is_none();
            return whole.then(|| SharedAnswer(self.relayed.of(&answer.encoded)));
        };
        let whole = match &entry.whole {
            Some((incarnation, whole)) if *incarnation == answer.leader_incarnation => {
                whole.clone()
            }
            _ => {
                let whole = Arc::new(AnswerBytes::encode(answer));
                entry.whole = Some((answer.leader_incarnation, whole.clone()));
                whole
            }
        };
        Some(SharedAnswer(whole))
    }
}

/// `fields` if an answer carrying them stays within `limit`, else RESOURCE_EXHAUSTED naming it.
fn within_answer_limit(
    fields: bytes::Bytes,
    tasks: usize,
    limit: usize,
) -> Result<bytes::Bytes, CoordError> {
    if fields.len() > limit {
        return Err(CoordError::ResourceExhausted(format!(
            "WaitForAllTasks: the devices of the job's {tasks} tasks take {} bytes, past the \
             answer limit of {limit} bytes",
            fields.len()
        )));
    }
    Ok(fields)
}

/// The largest answer the service sends: what its transport is set to encode
/// ([`PEER_MESSAGE_LIMIT`]), less room for the fields beside the device list.
const ANSWER_LIMIT: usize = PEER_MESSAGE_LIMIT - 1024;

fn client(ch: PeerChannel) -> CoordinationServiceClient<PeerChannel> {
    CoordinationServiceClient::new(ch)
        .max_decoding_message_size(PEER_MESSAGE_LIMIT)
        .max_encoding_message_size(PEER_MESSAGE_LIMIT)
}

fn entry(key: String, value: bytes::Bytes) -> tf::KeyValueEntry {
    tf::KeyValueEntry { key, value }
}

/// Runs `f`, giving its service errors TensorFlow's payload. (Not an `async fn`: one would keep
/// `f` twice, as its argument and as what it awaits, and a parked call keeps this future.)
fn served<T>(
    f: impl std::future::Future<Output = Result<T, CoordError>>,
) -> impl std::future::Future<Output = Result<T, CoordError>> {
    futures::FutureExt::map(f, |r| r.map_err(|e| detailed_with(e, None)))
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
/// What TensorFlow's Heartbeat answers `task` (of the current call's namespace), before its
/// error gets its payload: the service incarnation, or the task's own state as an error, or another
/// task's failure the task has not learnt of (see the module doc). Shared by the Heartbeat call and
/// the heartbeats a sidecar sends together (`api::coordination`).
pub(crate) fn heartbeat_answer(
    core: &CoordCore,
    task: &coord_raft_store::state::TaskName,
    incarnation: u64,
) -> Result<u64, CoordError> {
    let leader_incarnation = core.heartbeat(task, incarnation)?;
    if let Some(e) = core.unseen_error(task)? {
        return Err(propagated(&e));
    }
    Ok(leader_incarnation)
}

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
pub(crate) fn devices_of(req: &tf::WaitForAllTasksRequest) -> Result<DeviceInfo, CoordError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Vec<DeviceInfo> {
        (0..3u8)
            .map(|i| DeviceInfo::Tf(vec![bytes::Bytes::from(vec![i; 8])]))
            .collect()
    }

    fn answer(form: AnswerForm) -> tf::WaitForAllTasksResponse {
        let wire = tf::WaitForAllTasksResponse {
            leader_incarnation: 1,
            encoded: form.encode(&all()),
            ..Default::default()
        }
        .encode_to_vec();
        tf::WaitForAllTasksResponse::decode(&wire[..]).expect("decodes")
    }

    #[test]
    fn each_client_form_gets_the_fields_it_reads() {
        let current = answer(AnswerForm::Current);
        assert_eq!(current.device_info.map(|d| d.device.len()), Some(3));
        assert_eq!(current.cluster_device_info, None, "2.21 reserves field 3");
        let older = answer(AnswerForm::Older { xla: false });
        assert_eq!(older.device_info, None);
        assert_eq!(
            older.cluster_device_info,
            Some(cluster_devices(&all()[0], &all()))
        );
        let unknown = answer(AnswerForm::Unknown);
        assert!(unknown.device_info.is_some() && unknown.cluster_device_info.is_some());
    }

    #[test]
    fn forms_follow_the_field_the_caller_sent() {
        let mut req = tf::WaitForAllTasksRequest::default();
        assert_eq!(AnswerForm::of(&req), AnswerForm::Unknown);
        req.local_device_info = Some(tf::CoordinationServiceDeviceInfo::default());
        assert_eq!(AnswerForm::of(&req), AnswerForm::Older { xla: false });
        req.device_info = Some(tf::DeviceInfo::default());
        assert_eq!(AnswerForm::of(&req), AnswerForm::Current);
    }

    #[test]
    fn an_answer_past_the_limit_is_refused_naming_it() {
        let fields = AnswerForm::Current.encode(&all());
        let e = within_answer_limit(fields.clone(), 3, fields.len() - 1).expect_err("too big");
        let s = tonic::Status::from(e);
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert!(
            s.message()
                .contains(&format!("answer limit of {} bytes", fields.len() - 1)),
            "{}",
            s.message()
        );
        assert!(within_answer_limit(fields.clone(), 3, fields.len()).is_ok());
    }
}

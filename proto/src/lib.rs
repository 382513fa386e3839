//! coord-proto: every wire schema of coord, compiled by `build.rs` with `protox`.
//!
//! The modules, bottom up. Each uses only modules listed before it, so there is no import circle
//! (`tests/tests/house.rs` checks every crate for one):
//!
//! - [`codec`]: the prost codec every service uses, with small initial buffers.
//! - [`fuzz`]: the deterministic random stream of the fuzz tests.
//! - [`wait_answer`]: TensorFlow's `WaitForAllTasksResponse`, able to carry a device list encoded once.
//! - [`alive_answer`]: XLA's `GetAliveTasksResponse`, able to carry its fields encoded once.
//! - The generated schemas, written in this file (each service's code uses [`codec`]):
//!   - [`tensorflow`]: `tensorflow.CoordinationService`, TensorFlow's coordination service
//!     schema, including the fields TensorFlow added later (`allow_overwrite`, barrier
//!     `counter`); the framework messages (`GraphDef`, `TensorProto`...) the tf.data service
//!     carries.
//!   - [`tensorflow::data`]: TensorFlow 2.21's tf.data service (`DispatcherService`,
//!     `WorkerService`), written out of the wheel's own descriptors by `tests/tf/tf_schema.py`.
//!   - [`xla::coordination`]: `xla.coordination.CoordinationService`, what jaxlib 0.10+ speaks;
//!     [`tensorflow::distributed_runtime`] carries its error details.
//!   - [`coord::raft`]: the Raft transport between replicas.
//!   - [`coord::admin`]: administration of the ensemble: status, tasks, barriers, snapshots,
//!     membership changes (`coordctl member add|remove|list`), service shutdown.
//!   - [`coord::coordination`]: error polling and task states, beside the TF service.
//!   - [`coord::kv`]: atomic increment, key watches, and the raw key space (torch's store).
//!   - [`coord::dispatcher`]: the tf.data-style dispatcher and the data worker's element service.
//!   - [`coord::link`]: the worker-to-worker link: rendezvous tensors and peer heartbeats.
//! - [`conn`]: gRPC connections: fewer, larger socket writes, and the Raft preface.
//! - [`metadata`]: request ids, leader hints and the namespace, carried as gRPC metadata.
//! - [`shape`]: a job's shape as the flags and `--cluster-config` files spell it.
//! - [`tls`]: TLS configurations and the identities certificates carry.
//! - [`dataset`]: dataset definitions: validation, fingerprints, splits and elements.
//! - [`tf_dataset`]: the split providers TF 2.21's tf.data dispatcher makes for a client's
//!   dataset graph (`DatasetDef`), and split `i` of each, derived without TensorFlow.

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

pub mod tensorflow {
    tonic::include_proto!("tensorflow");
    /// Able to carry the job's devices encoded once (see [`crate::wait_answer`]).
    pub type WaitForAllTasksResponse =
        crate::wait_answer::WaitAnswer<DeviceInfo, CoordinationServiceDeviceInfo>;

    /// `GrpcPayloadContainer`: the error details TensorFlow and XLA put in
    /// `grpc-status-details-bin`.
    pub mod distributed_runtime {
        tonic::include_proto!("tensorflow.distributed_runtime");

        /// The payload every error of the coordination service carries (its presence tells an
        /// answer of the service from a broken connection).
        pub const COORDINATION_ERROR_URL: &str =
            "type.googleapis.com/tensorflow.CoordinationServiceError";
        /// The payload a barrier's error adds.
        pub const BARRIER_ERROR_URL: &str = "type.googleapis.com/tensorflow.BarrierError";

        /// The `CoordinationServiceError` in an error's details (`grpc-status-details-bin`), if
        /// it carries one.
        pub fn coordination_error(details: &[u8]) -> Option<super::CoordinationServiceError> {
            use prost::Message;
            let container = GrpcPayloadContainer::decode(details).ok()?;
            let bytes = container.payloads.get(COORDINATION_ERROR_URL)?;
            super::CoordinationServiceError::decode(&bytes[..]).ok()
        }
    }

    /// The tf.data service: `tensorflow.data.DispatcherService` and `WorkerService`, with the
    /// messages they carry (`TaskDef`, `DataServiceMetadata`, `ProcessingModeDef`...).
    pub mod data {
        tonic::include_proto!("tensorflow.data");

        /// `snapshot.proto` (distributed snapshots, which coord does not serve).
        pub mod experimental {
            tonic::include_proto!("tensorflow.data.experimental");
        }
    }

    /// `error_codes.proto`: the codes a `StatusProto` carries.
    pub mod error {
        tonic::include_proto!("tensorflow.error");
    }
}

/// `xla.coordination.CoordinationService`: the service jaxlib 0.10+ clients speak.
pub mod xla {
    pub mod coordination {
        tonic::include_proto!("xla.coordination");
        /// Able to carry its fields encoded once (see [`crate::alive_answer`]).
        pub type GetAliveTasksResponse = crate::alive_answer::AliveAnswer;
    }
}

pub mod coord {
    pub mod raft {
        tonic::include_proto!("coord.raft");
    }
    pub mod admin {
        tonic::include_proto!("coord.admin");
    }
    pub mod coordination {
        tonic::include_proto!("coord.coordination");
    }
    pub mod kv {
        tonic::include_proto!("coord.kv");
    }
    pub mod dispatcher {
        tonic::include_proto!("coord.dispatcher");
    }
    pub mod link {
        tonic::include_proto!("coord.link");
    }
}

/// A status code as gRPC names it (`OK`, `UNAVAILABLE`), as TensorFlow, every gRPC library and
/// Prometheus exporters of gRPC servers print it; not tonic's Rust names (`Ok`, `Unavailable`).
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Every schema of this crate as a serialized `google.protobuf.FileDescriptorSet`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/coord_descriptors.bin"));

pub mod alive_answer;
pub mod codec;
pub mod conn;
pub mod dataset;
pub mod fuzz;
pub mod metadata;
pub mod shape;
pub mod tf_dataset;
pub mod tls;
pub mod wait_answer;

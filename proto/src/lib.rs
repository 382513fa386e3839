//! coord-proto: every wire schema of coord, compiled by `build.rs` with `protox`.
//!
//! - [`tensorflow`]: `tensorflow.CoordinationService`, the seed schema plus the fields TensorFlow
//!   added later (`allow_overwrite`, barrier `counter`).
//! - [`coord::raft`]: the Raft transport between replicas.
//! - [`coord::admin`]: ensemble status, service shutdown (and membership, later).
//! - [`coord::coordination`]: error polling and task states, beside the TF service.
//! - [`coord::kv`]: atomic increment and key watches.
//! - [`metadata`]: request ids and leader hints, carried as gRPC metadata.
//! - [`codec`]: the prost codec every service uses, with small initial buffers.

#![allow(clippy::doc_lazy_continuation, clippy::large_enum_variant)]

pub mod tensorflow {
    tonic::include_proto!("tensorflow");
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
}

pub mod codec;
pub mod metadata;

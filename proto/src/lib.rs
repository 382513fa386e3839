//! coord-proto: every wire schema of coord, compiled by `build.rs` with `protox`.
//!
//! - [`tensorflow`]: `tensorflow.CoordinationService`, the seed schema plus the fields TensorFlow
//!   added later (`allow_overwrite`, barrier `counter`).
//! - [`coord::raft`]: the Raft transport between replicas.
//! - [`coord::admin`]: ensemble status (and membership, later).
//! - [`metadata`]: request ids and leader hints, carried as gRPC metadata.

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
}

pub mod metadata;

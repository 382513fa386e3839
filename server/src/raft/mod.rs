//! The Raft node's network and leadership.
//!
//! - [`network`], [`service`]: the openraft network adapter (implemented here and nowhere else)
//!   and the gRPC service that receives its calls; [`peers`]: one channel per peer.
//! - [`link`]: AppendEntries over framed TCP links; [`pre_append`]: a leader's lone writes sent
//!   to followers while it syncs them; [`link_tls`]: both over TLS in a TLS ensemble.
//! - [`accept`]: the gRPC port's accept loop, which sorts peers' Raft connections from clients'.
//! - [`leader`]: who leads, as this replica believes; [`election`]: a prompt election after a
//!   leader dies.
//! - [`membership`]: adding and removing replicas at runtime.

pub mod accept;
pub mod election;
pub mod handoff;
pub mod leader;
pub mod link;
pub mod link_tls;
pub mod membership;
pub mod network;
pub mod peers;
pub mod pre_append;
pub mod service;

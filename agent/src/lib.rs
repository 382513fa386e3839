//! coord-agent: the task side of coord.
//!
//! - [`client`]: [`CoordClient`], a client of the whole ensemble: it knows every replica, goes to
//!   the leader, follows leader changes and retries with the same request id, so a mutation applies
//!   once and a caller sees an error only when no replica could serve it for a configurable time.

pub mod client;

pub use client::{ClientOptions, CoordClient};

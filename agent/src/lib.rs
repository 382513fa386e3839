//! coord-agent: the task side of coord.
//!
//! The modules, bottom up. Each uses only modules listed before it, so there is no import circle
//! (`tests/tests/house.rs` checks every crate for one):
//!
//! - [`open_files`]: a process's open files limit, raised to what the host allows.
//! - [`client`]: [`CoordClient`], a client of the whole ensemble: it knows every replica, goes to
//!   the leader, follows leader changes and retries with the same request id, so a mutation applies
//!   once and a caller sees an error only when no replica could serve it for a configurable time.
//! - [`tls`]: the TLS flags every program of this crate reads; [`namespace`]: the flags that
//!   declare a namespace's job and limits.
//! - [`watch`]: key watches that resume across leader changes without losing or repeating a
//!   change.
//! - [`agent`]: [`Agent`], TensorFlow's coordination agent (`CoordinationServiceAgent`) over a
//!   whole ensemble: task state machine, heartbeats, error callback, key-value, barriers, watches.
//! - [`blocking`]: [`BlockingAgent`], the same for callers without an async runtime.
//! - [`preemption`]: TensorFlow's preemption sync (`PreemptionSyncManager`), run again for every
//!   preemption of a job whose service outlives its tasks.
//! - [`rendezvous`]: TensorFlow's `RendezvousMgr` over direct worker links, with peer
//!   heartbeats on the same links.
//! - [`data`]: the tf.data data plane: the data worker and the consumer of the dispatcher's jobs.
//! - [`proxy`]: coord-proxy's services, which let unmodified TensorFlow and jaxlib clients use
//!   the ensemble and survive its failovers.

pub mod agent;
pub mod blocking;
pub mod client;
pub mod data;
pub mod namespace;
pub mod open_files;
pub mod preemption;
pub mod proxy;
pub mod rendezvous;
pub mod tls;
pub mod watch;

pub use agent::{Agent, AgentConfig, AgentState, TaskStatus};
pub use blocking::BlockingAgent;
pub use client::{ClientOptions, CoordClient};
pub use watch::{ChangeKind, KeyChange};

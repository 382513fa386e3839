//! Fault injection and checking: the ensemble under a seeded schedule of crashes, pauses and
//! partitions, with clients recording what they saw, and checkers that judge the record.
//!
//! - [`netproxy`]: cuts links between replicas, per direction.
//! - [`schedule`]: seeded fault schedules (a schedule is a function of its seed).
//! - [`workload`]: the clients, which record every call.
//! - [`linearize`]: the linearizability checker and the key-value model.
//! - [`history`]: what the clients recorded, and the checks run on it.
//! - [`recovery`]: once the faults have healed, every call completes within a bound.
//! - [`runner`]: one run: ensemble, workload, faults, healing, final reads, checks, and the
//!   record of a failed run.
//! - [`crash`]: the crash-consistency loop (kill -9 one or all replicas under load, restart,
//!   verify).

pub mod crash;
pub mod history;
pub mod linearize;
pub mod netproxy;
pub mod recovery;
pub mod runner;
pub mod schedule;
pub mod workload;

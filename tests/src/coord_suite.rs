//! The coordination service's behaviour suite, written once and run against ensembles of
//! different sizes ([`coordination_suite!`] instantiates it).
//!
//! Each check starts its own ensemble with the job configuration it needs, talks to it through
//! `CoordClient` (all replicas, leader-following), and asserts outcomes and exact gRPC codes.
//!
//! What every check shares ([`Env`], task names, assertions) sits in `env`; the checks sit in
//! submodules by area over it, and are re-exported here with the macro:
//!
//! - `tasks`: registration, WaitForAllTasks, heartbeats and their timeouts, reported errors.
//! - `barriers`: barriers that pass and are reused, and every way a barrier fails.
//! - `beats`, `arrivals`: heartbeats and barrier arrivals a sidecar sends together; `reads`:
//!   reads its tasks send alike, sent once (`sidecar` starts the sidecar of these checks).
//! - `shutdown`: ShutdownTask with and without a shutdown barrier, and the service's shutdown.

mod arrivals;
mod barriers;
mod beats;
mod env;
mod reads;
mod shutdown;
mod sidecar;
mod tasks;

pub use env::{assert_code, task, w, Env, LEADER_TIMEOUT};

pub use arrivals::{
    a_sidecar_fetches_the_jobs_devices_once, a_sidecar_records_its_tasks_barrier_arrivals_together,
    a_sidecars_tasks_share_one_answer, barrier_arrivals_recorded_together,
    wait_for_all_arrivals_recorded_together,
};
pub use barriers::{barrier_failures, barriers_pass_and_are_reused};
pub use beats::{a_sidecar_sends_its_tasks_heartbeats_together, heartbeats_sent_together};
pub use reads::a_sidecar_reads_alike_keys_once;
pub use shutdown::{shutdown_barrier, shutdown_service_aborts_barriers, shutdown_without_barrier};
pub use tasks::{
    heartbeats_and_timeouts, register_and_wait_for_all_tasks, registration_rules,
    reported_errors_reach_every_task,
};

/// Instantiates the suite for an ensemble of `$replicas` replicas.
#[macro_export]
macro_rules! coordination_suite {
    ($replicas:expr) => {
        use $crate::coord_suite as suite;

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn register_and_wait_for_all_tasks() {
            suite::register_and_wait_for_all_tasks($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn registration_rules() {
            suite::registration_rules($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn heartbeats_and_timeouts() {
            suite::heartbeats_and_timeouts($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn heartbeats_sent_together() {
            suite::heartbeats_sent_together($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_sidecar_sends_its_tasks_heartbeats_together() {
            suite::a_sidecar_sends_its_tasks_heartbeats_together($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn reported_errors_reach_every_task() {
            suite::reported_errors_reach_every_task($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn barriers_pass_and_are_reused() {
            suite::barriers_pass_and_are_reused($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn barrier_failures() {
            suite::barrier_failures($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn barrier_arrivals_recorded_together() {
            suite::barrier_arrivals_recorded_together($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_sidecar_records_its_tasks_barrier_arrivals_together() {
            suite::a_sidecar_records_its_tasks_barrier_arrivals_together($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn wait_for_all_arrivals_recorded_together() {
            suite::wait_for_all_arrivals_recorded_together($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_sidecar_fetches_the_jobs_devices_once() {
            suite::a_sidecar_fetches_the_jobs_devices_once($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_sidecars_tasks_share_one_answer() {
            suite::a_sidecars_tasks_share_one_answer($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_sidecar_reads_alike_keys_once() {
            suite::a_sidecar_reads_alike_keys_once($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_service_aborts_barriers() {
            suite::shutdown_service_aborts_barriers($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_barrier() {
            suite::shutdown_barrier($replicas).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn shutdown_without_barrier() {
            suite::shutdown_without_barrier($replicas).await
        }
    };
}

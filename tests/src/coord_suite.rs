//! The coordination service's behaviour suite, written once and run against ensembles of
//! different sizes ([`coordination_suite!`] instantiates it).
//!
//! Each check starts its own ensemble with the job configuration it needs, talks to it through
//! `CoordClient` (all replicas, leader-following), and asserts outcomes and exact gRPC codes.
//!
//! This module holds what every check shares ([`Env`], task names, assertions) and the macro; the
//! checks sit in submodules by area, and are re-exported here:
//!
//! - `tasks`: registration, WaitForAllTasks, heartbeats and their timeouts, reported errors.
//! - `barriers`: barriers that pass and are reused, and every way a barrier fails.
//! - `shutdown`: ShutdownTask with and without a shutdown barrier, and the service's shutdown.

use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use tonic::Code;

use crate::cluster::{Cluster, ClusterOptions};

mod barriers;
mod shutdown;
mod tasks;

pub use barriers::{barrier_failures, barriers_pass_and_are_reused};
pub use shutdown::{shutdown_barrier, shutdown_service_aborts_barriers, shutdown_without_barrier};
pub use tasks::{
    heartbeats_and_timeouts, register_and_wait_for_all_tasks, registration_rules,
    reported_errors_reach_every_task,
};

pub const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// An ensemble and a client of it.
pub struct Env {
    pub cluster: Cluster,
    pub client: CoordClient,
}

impl Env {
    /// Starts `replicas` replicas with `flags` (the job configuration) and waits for a leader.
    pub async fn start(replicas: usize, flags: &[&str]) -> Env {
        let mut cluster = Cluster::start(ClusterOptions {
            replicas,
            extra_args: flags.iter().map(|s| s.to_string()).collect(),
            ..ClusterOptions::default()
        });
        cluster.wait_for_leader(LEADER_TIMEOUT).await;
        let client = CoordClient::new(ClientOptions::new(cluster.endpoints())).expect("client");
        client.find_leader().await;
        Env { cluster, client }
    }

    /// Waits (with a deadline) until at least `n` calls are parked on the ensemble, i.e. the calls
    /// started before are waiting on the leader.
    pub async fn wait_parked(&mut self, n: u64) {
        self.wait_metric("coord_parked_calls", n).await;
    }

    /// Waits (with a deadline) until at least `n` key watches are being served.
    pub async fn wait_watches(&mut self, n: u64) {
        self.wait_metric("coord_active_watches", n).await;
    }

    /// Waits until the gauge `name`, summed over the replicas, reaches `n`.
    async fn wait_metric(&mut self, name: &str, n: u64) {
        let prefix = format!("{name} ");
        self.cluster
            .wait_until(LEADER_TIMEOUT, &format!("{name} >= {n}"), |c| {
                let total: u64 = c
                    .ids()
                    .iter()
                    .filter_map(|&id| crate::http::get(c.replica(id).http, "/metrics").ok())
                    .filter_map(|(_, m)| {
                        m.lines()
                            .find_map(|l| l.strip_prefix(prefix.as_str()))
                            .and_then(|v| v.trim().parse::<f64>().ok())
                    })
                    .map(|v| v as u64)
                    .sum();
                total >= n
            })
            .await;
    }

    /// Another client with its own connections (a different agent).
    pub fn another_client(&self) -> CoordClient {
        CoordClient::new(ClientOptions::new(self.cluster.endpoints())).expect("client")
    }
}

pub fn task(job: &str, id: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: job.into(),
        task_id: id,
        recoverable: false,
    }
}

pub fn w(id: i32) -> tf::CoordinatedTask {
    task("worker", id)
}

/// Asserts an error with `code` whose message contains `needle`.
pub fn assert_code<T: std::fmt::Debug>(r: Result<T, tonic::Status>, code: Code, needle: &str) {
    match r {
        Ok(v) => panic!("expected {code:?} mentioning {needle:?}, got Ok({v:?})"),
        Err(s) => {
            assert_eq!(s.code(), code, "{s:?}");
            assert!(
                s.message().contains(needle),
                "message {:?} should mention {needle:?}",
                s.message()
            );
        }
    }
}

async fn state_of(c: &CoordClient, t: &tf::CoordinatedTask) -> tf::CoordinatedTaskState {
    let resp = c
        .task_states(std::slice::from_ref(t))
        .await
        .expect("task states");
    tf::CoordinatedTaskState::try_from(resp.tasks[0].state).expect("state")
}

async fn register_all(c: &CoordClient, n: i32) -> u64 {
    let mut incarnation = 0;
    for i in 0..n {
        incarnation = c
            .register_task(&w(i), 100 + i as u64)
            .await
            .expect("register");
    }
    incarnation
}

fn tf_devices(name: &str) -> tf::CoordinationServiceDeviceInfo {
    tf::CoordinationServiceDeviceInfo {
        r#type: Some(tf::coordination_service_device_info::Type::Tf(
            tf::TfDeviceList {
                devices: vec![bytes::Bytes::from(name.to_string())],
            },
        )),
    }
}

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

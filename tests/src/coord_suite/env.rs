//! What every check of the suite shares: [`Env`] (an ensemble and a client of it), task names,
//! the exact-code assertion, and a few steps many checks take. A leaf under the checks.

use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use tonic::Code;

use crate::cluster::{Cluster, ClusterOptions};

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

    /// Waits (with a deadline) until the `n` calls started before are waiting: parked on the
    /// leader, or held by a follower that recorded their arrivals there (a follower waits on the
    /// leader with one call for all its TensorFlow WaitForAllTasks and jaxlib GetAliveTasks
    /// callers of a round, see `api::relayed_waits`).
    pub async fn wait_parked(&mut self, n: u64) {
        let waiting = |c: &Cluster, gauge: &str| samples(c, gauge).iter().sum::<u64>() >= n;
        self.cluster
            .wait_until(
                LEADER_TIMEOUT,
                &format!("{n} calls parked on the leader or held by a follower"),
                |c| waiting(c, "coord_parked_calls") || waiting(c, "coord_relayed_waiting_calls"),
            )
            .await;
    }

    /// Waits (with a deadline) until at least `n` key watches are being served.
    pub async fn wait_watches(&mut self, n: u64) {
        self.wait_metric("coord_active_watches", n).await;
    }

    /// Waits until the gauge `name`, summed over the replicas, reaches `n`.
    async fn wait_metric(&mut self, name: &str, n: u64) {
        self.cluster
            .wait_until(LEADER_TIMEOUT, &format!("{name} >= {n}"), |c| {
                samples(c, name).iter().sum::<u64>() >= n
            })
            .await;
    }

    /// Waits (with a deadline) until the replicas count at least `at_least` calls of `method`
    /// answered OK ([`ok_calls`]), and returns the count.
    pub async fn counted_ok(&mut self, method: &str, at_least: u64) -> u64 {
        self.cluster
            .wait_until(LEADER_TIMEOUT, &format!("{method} calls counted"), |c| {
                ok_calls(c, method) >= at_least
            })
            .await;
        ok_calls(&self.cluster, method)
    }

    /// Another client with its own connections (a different agent).
    pub fn another_client(&self) -> CoordClient {
        CoordClient::new(ClientOptions::new(self.cluster.endpoints())).expect("client")
    }
}

/// Sample `sample` (its name and labels, as `/metrics` prints them) on each replica that has it.
pub(super) fn samples(c: &Cluster, sample: &str) -> Vec<u64> {
    let prefix = format!("{sample} ");
    c.ids()
        .iter()
        .filter_map(|&id| crate::http::get(c.replica(id).http, "/metrics").ok())
        .filter_map(|(_, m)| {
            m.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map(|v| v as u64)
        .collect()
}

/// Calls of `method` answered OK, as the replica that counted most of them counts them (the one a
/// client's calls entered by).
pub(super) fn ok_calls(c: &Cluster, method: &str) -> u64 {
    let sample = format!("coord_rpc_duration_seconds_count{{method=\"{method}\",code=\"OK\"}}");
    samples(c, &sample).into_iter().max().unwrap_or(0)
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

pub(super) async fn state_of(c: &CoordClient, t: &tf::CoordinatedTask) -> tf::CoordinatedTaskState {
    let resp = c
        .task_states(std::slice::from_ref(t))
        .await
        .expect("task states");
    tf::CoordinatedTaskState::try_from(resp.tasks[0].state).expect("state")
}

pub(super) async fn register_all(c: &CoordClient, n: i32) -> u64 {
    let mut incarnation = 0;
    for i in 0..n {
        incarnation = c
            .register_task(&w(i), 100 + i as u64)
            .await
            .expect("register");
    }
    incarnation
}

pub(super) fn tf_devices(name: &str) -> tf::CoordinationServiceDeviceInfo {
    tf::CoordinationServiceDeviceInfo {
        r#type: Some(tf::coordination_service_device_info::Type::Tf(
            tf::TfDeviceList {
                devices: vec![bytes::Bytes::from(name.to_string())],
            },
        )),
    }
}

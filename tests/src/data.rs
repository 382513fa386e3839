//! tf.data data plane helpers for tests and benchmarks: `data-worker` processes on free loopback
//! ports (killed when dropped), and a consumer that reads a whole job.

use std::process::{Child, Command, Stdio};

use coord_agent::data::{Consumer, ConsumerOptions, DispatchClient};
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::coord::dispatcher as pb;
use coord_proto::dataset::range_value;
use tonic::Status;

use crate::cluster::{free_ports, workspace_binary};

/// A `data-worker` process.
pub struct WorkerProc {
    pub address: String,
    child: Option<Child>,
}

impl WorkerProc {
    /// Starts a worker heartbeating every `heartbeat_ms` to `endpoints`.
    pub fn start(endpoints: &[String], heartbeat_ms: u64) -> Self {
        Self::start_in(endpoints, heartbeat_ms, None)
    }

    /// Starts a worker of namespace `namespace`'s dispatcher (`None`: the default one's).
    pub fn start_in(endpoints: &[String], heartbeat_ms: u64, namespace: Option<&str>) -> Self {
        let port = free_ports(1)[0];
        let address = format!("127.0.0.1:{port}");
        let child = Command::new(workspace_binary("data-worker", None))
            .args(["--coordinators", &endpoints.join(",")])
            .args(namespace.map(|n| ["--namespace", n]).into_iter().flatten())
            .args(["--listen", &address])
            .args(["--heartbeat-ms", &heartbeat_ms.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Warnings only: a test's output is no place for every task start.
            .env("RUST_LOG", "warn")
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn data-worker");
        Self {
            address,
            child: Some(child),
        }
    }

    /// kill -9.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A dispatcher client of the ensemble at `endpoints`.
pub fn dispatch_client(endpoints: &[String]) -> DispatchClient {
    dispatch_client_in(endpoints, None)
}

/// A dispatcher client of namespace `namespace` (`None`: the default one).
pub fn dispatch_client_in(endpoints: &[String], namespace: Option<&str>) -> DispatchClient {
    let mut options = ClientOptions::new(endpoints.to_vec());
    options.namespace = namespace.map(str::to_string);
    DispatchClient::new(CoordClient::new(options).expect("client"))
}

/// Registers `def` and makes (or joins) a job; returns (job, client).
pub async fn job(
    d: &DispatchClient,
    def: pb::DatasetDef,
    mode: pb::ProcessingMode,
    name: Option<&str>,
    num_consumers: Option<u64>,
) -> Result<(u64, u64), Status> {
    let ds = d
        .get_or_register_dataset(pb::GetOrRegisterDatasetRequest { dataset: Some(def) })
        .await?;
    let j = d
        .get_or_create_job(pb::GetOrCreateJobRequest {
            dataset_id: ds.dataset_id,
            mode: mode as i32,
            job_name: name.map(str::to_string),
            num_consumers,
        })
        .await?;
    Ok((j.job_id, j.client_id))
}

/// Reads range elements from `consumer` until the job ends (or `limit` elements), decoded.
pub async fn read_values(consumer: &mut Consumer, limit: usize) -> Result<Vec<i64>, Status> {
    let mut out = Vec::new();
    while out.len() < limit {
        match consumer.next().await? {
            None => break,
            Some(e) => out.push(range_value(&e.data).ok_or_else(|| {
                Status::data_loss(format!(
                    "element of {} bytes is not a range value",
                    e.data.len()
                ))
            })?),
        }
    }
    Ok(out)
}

/// Starts a consumer of the job with a fast heartbeat.
pub async fn consumer(
    d: &DispatchClient,
    job: u64,
    client: u64,
    dedupe: bool,
    consumer_index: Option<u64>,
) -> Consumer {
    Consumer::start(
        d.clone(),
        job,
        client,
        ConsumerOptions {
            heartbeat: std::time::Duration::from_millis(200),
            dedupe,
            consumer_index,
        },
    )
    .await
    .expect("start consumer")
}

/// The dispatcher's view of every job.
pub async fn jobs(d: &DispatchClient) -> Vec<pb::JobInfo> {
    d.list_jobs(pb::ListJobsRequest {})
        .await
        .expect("list jobs")
        .jobs
}

/// Waits until `n` data workers are registered and alive (30 s at most).
pub async fn wait_workers(d: &DispatchClient, n: usize) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let w = d
            .get_workers(pb::GetWorkersRequest {})
            .await
            .map(|r| r.workers);
        if let Ok(w) = &w {
            if w.iter().filter(|w| w.alive).count() >= n {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workers did not register: {w:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn counts(values: &[i64]) -> std::collections::BTreeMap<i64, usize> {
    let mut m = std::collections::BTreeMap::new();
    for v in values {
        *m.entry(*v).or_default() += 1;
    }
    m
}

/// Every value of `expect` exactly `times` times, nothing else.
/// Every value of `expect` exactly `times` times in `values`, nothing else (any order).
pub fn assert_exactly(values: &[i64], expect: impl Iterator<Item = i64>, times: usize, what: &str) {
    let want: std::collections::BTreeMap<i64, usize> = expect.map(|v| (v, times)).collect();
    let got = counts(values);
    if got != want {
        let missing: Vec<_> = want
            .keys()
            .filter(|k| !got.contains_key(k))
            .take(10)
            .collect();
        let extra: Vec<_> = got
            .iter()
            .filter(|(k, n)| want.get(k) != Some(n))
            .take(10)
            .collect();
        panic!(
            "{what}: {} elements, want {}; missing {missing:?}, wrong counts {extra:?}",
            values.len(),
            want.values().sum::<usize>()
        );
    }
}

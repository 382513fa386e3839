//! A data directory written by the last build with two dispatchers (snapshot format 5: coord's
//! dispatcher and TensorFlow's side by side, each with updates in the log after the snapshot)
//! starts on today's build and serves every dataset, job and split position it held.
//!
//! The fixture (`tests/fixtures/dispatcher-v5.tar.xz`: three replicas' data directories and what
//! that build answered, `expect.json`) was written by `write_the_fixture` below, run against that
//! build (commit 4746564):
//!
//! ```sh
//! COORD_BIN=<its coordinator> COORD_FIXTURE_OUT=tests/fixtures \
//!   cargo test -p coord-tests --test dispatcher_upgrade write_the_fixture -- --ignored
//! ```
//!
//! Its replicas listen on 127.66.0.{1,2,3} (data directories name their ensemble's addresses),
//! loopback addresses nothing else here uses.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use coord_agent::data::DispatchClient;
use coord_proto::coord::dispatcher as pb;
use coord_proto::dataset::range;
use coord_proto::tensorflow::data as tf;
use coord_proto::tensorflow::data::dispatcher_service_client::DispatcherServiceClient;
use coord_tests::data::{dispatch_client, jobs};
use coord_tests::{Cluster, ClusterOptions};
use serde_json::{json, Value};
use tonic::transport::Channel;

const FIXTURE: &str = "dispatcher-v5.tar.xz";
const WAIT: Duration = Duration::from_secs(60);

fn addresses() -> Vec<(SocketAddr, SocketAddr)> {
    (1..=3u8)
        .map(|i| {
            (
                SocketAddr::from(([127, 66, 0, i], 7101)),
                SocketAddr::from(([127, 66, 0, i], 8101)),
            )
        })
        .collect()
}

fn fixtures() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// TensorFlow's `range(10)`, as a TF 2.21 client sends it (10 DYNAMIC splits).
fn range_10_graph() -> tf::DatasetDef {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../proto/tests/fixtures/tf_datasets/range_10.pb");
    let bytes = std::fs::read(&path).expect("the range_10 graph");
    prost::Message::decode(bytes.as_slice()).expect("a DatasetDef")
}

/// TensorFlow's dispatcher client, on replica 1 (a follower forwards to the leader).
async fn tf_client(cluster: &Cluster) -> DispatcherServiceClient<Channel> {
    let replica = cluster.replica(1).grpc;
    DispatcherServiceClient::connect(format!("http://{replica}"))
        .await
        .expect("connect")
}

/// The value of a split of `range`, as TensorFlow sends it (an int64 scalar's 8 bytes).
fn split_value(r: tf::GetSplitResponse) -> Option<i64> {
    let t = r.split?;
    let bytes: [u8; 8] = t.tensor_content[..].try_into().ok()?;
    Some(i64::from_le_bytes(bytes))
}

async fn tf_split(c: &mut DispatcherServiceClient<Channel>, iteration: i64) -> Option<i64> {
    let r = c
        .get_split(tf::GetSplitRequest {
            iteration_id: iteration,
            repetition: 0,
            split_provider_index: 0,
        })
        .await
        .expect("GetSplit")
        .into_inner();
    split_value(r)
}

async fn lease(d: &DispatchClient, task: u64, done: Vec<u64>, max: u32) -> Vec<u64> {
    d.get_split(pb::GetSplitRequest {
        task_id: task,
        splits_done: done,
        max_splits: max,
    })
    .await
    .expect("GetSplit")
    .splits
}

/// Registers a coord data worker (no process behind it: the test speaks for it) and returns
/// its registration and tasks.
async fn data_worker(
    d: &DispatchClient,
    address: &str,
    current: Vec<u64>,
) -> pb::WorkerHeartbeatResponse {
    d.worker_heartbeat(pb::WorkerHeartbeatRequest {
        worker_address: address.into(),
        current_tasks: current,
    })
    .await
    .expect("WorkerHeartbeat")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "writes the fixture; run against the build of before (see the module's doc)"]
async fn write_the_fixture() {
    let out = std::env::var("COORD_FIXTURE_OUT").expect("COORD_FIXTURE_OUT");
    let mut cluster = Cluster::at(ClusterOptions::default(), &addresses());
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    cluster.wait_for_leader(WAIT).await;
    let d = dispatch_client(&cluster.endpoints());
    // coord's dispatcher: a data worker, a DYNAMIC job with leased splits, an OFF job.
    let worker = data_worker(&d, "fixture-data:1", vec![]).await;
    let dataset = d
        .get_or_register_dataset(pb::GetOrRegisterDatasetRequest {
            dataset: Some(range(0, 100)),
        })
        .await
        .expect("dataset");
    let job = |name: &str, mode: pb::ProcessingMode| pb::GetOrCreateJobRequest {
        dataset_id: dataset.dataset_id,
        mode: mode as i32,
        job_name: Some(name.into()),
        num_consumers: None,
    };
    let dynamic = d
        .get_or_create_job(job("upgrade-dynamic", pb::ProcessingMode::Dynamic))
        .await
        .expect("job");
    let off = d
        .get_or_create_job(job("upgrade-off", pb::ProcessingMode::Off))
        .await
        .expect("job");
    let tasks = data_worker(&d, "fixture-data:1", vec![]).await.new_tasks;
    let task = tasks
        .iter()
        .find(|t| t.job_id == dynamic.job_id)
        .expect("a task of the DYNAMIC job")
        .task_id;
    let first = lease(&d, task, vec![], 5).await;
    let second = lease(&d, task, vec![0, 1], 3).await;
    // TensorFlow's dispatcher: a worker, a DYNAMIC job and iteration, three splits.
    let mut t = tf_client(&cluster).await;
    t.worker_heartbeat(tf::WorkerHeartbeatRequest {
        worker_address: "fixture-tf:1".into(),
        ..Default::default()
    })
    .await
    .expect("TF worker");
    let tf_dataset = t
        .get_or_register_dataset(tf::GetOrRegisterDatasetRequest {
            dataset: Some(range_10_graph()),
            metadata: Some(tf::DataServiceMetadata::default()),
            optional_dataset_id: None,
        })
        .await
        .expect("TF dataset")
        .into_inner()
        .dataset_id;
    let tf_job = t
        .get_or_create_job(tf::GetOrCreateJobRequest {
            dataset_id: tf_dataset.clone(),
            processing_mode_def: Some(tf::ProcessingModeDef { sharding_policy: 1 }),
            optional_job_name: Some(tf::get_or_create_job_request::OptionalJobName::JobName(
                "tf-upgrade".into(),
            )),
            ..Default::default()
        })
        .await
        .expect("TF job")
        .into_inner()
        .job_id;
    let tf_client_id = t
        .get_or_create_iteration(tf::GetOrCreateIterationRequest {
            job_id: tf_job,
            repetition: 0,
        })
        .await
        .expect("TF iteration")
        .into_inner()
        .iteration_client_id;
    let tf_iteration = 2000;
    let mut tf_splits = Vec::new();
    for _ in 0..3 {
        tf_splits.push(tf_split(&mut t, tf_iteration).await);
    }
    // Every replica snapshots: what came so far is in format 5.
    let admin = d.coord().clone();
    for i in 0..3 {
        admin.snapshot_of(i).await.expect("snapshot");
    }
    // And after the snapshot, in the log: more of each.
    let third = lease(&d, task, vec![2, 3], 2).await;
    let later = d
        .get_or_register_dataset(pb::GetOrRegisterDatasetRequest {
            dataset: Some(range(0, 40)),
        })
        .await
        .expect("dataset");
    let after = d
        .get_or_create_job(pb::GetOrCreateJobRequest {
            dataset_id: later.dataset_id,
            mode: pb::ProcessingMode::Dynamic as i32,
            job_name: Some("after-snapshot".into()),
            num_consumers: None,
        })
        .await
        .expect("job");
    let tasks = data_worker(&d, "fixture-data:1", vec![task])
        .await
        .new_tasks;
    let after_task = tasks
        .iter()
        .find(|t| t.job_id == after.job_id)
        .expect("a task of the later job")
        .task_id;
    let after_splits = lease(&d, after_task, vec![], 4).await;
    for _ in 0..2 {
        tf_splits.push(tf_split(&mut t, tf_iteration).await);
    }
    let leased = [first, second, third].concat();
    let expect = json!({
        "worker": {"address": "fixture-data:1", "registration": worker.worker_id},
        "dataset": dataset.dataset_id,
        "dynamic": {"job": dynamic.job_id, "client": dynamic.client_id, "task": task,
                    "leased": leased},
        "off": {"job": off.job_id, "client": off.client_id},
        "after": {"dataset": later.dataset_id, "job": after.job_id, "client": after.client_id,
                  "task": after_task, "leased": after_splits},
        "tf": {"dataset": tf_dataset, "job": tf_job, "client": tf_client_id,
               "iteration": tf_iteration, "splits": tf_splits},
    });
    for id in cluster.ids() {
        cluster.kill(id);
    }
    let root = cluster.root().to_path_buf();
    std::fs::write(root.join("expect.json"), expect.to_string()).expect("write");
    let tar = Path::new(&out).join(FIXTURE);
    let status = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .args(["-cJf"])
        .arg(&tar)
        .args(["expect.json", "data-1", "data-2", "data-3"])
        .status()
        .expect("tar");
    assert!(status.success(), "tar failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_data_directory_serves_every_dataset_job_and_split_position() {
    let mut cluster = Cluster::at(ClusterOptions::default(), &addresses());
    let root = cluster.root().to_path_buf();
    let status = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-xJf")
        .arg(fixtures().join(FIXTURE))
        .status()
        .expect("tar");
    assert!(status.success(), "tar could not unpack the fixture");
    let e: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("expect.json")).expect("expect.json"),
    )
    .expect("JSON");
    let n = |v: &Value| v.as_u64().expect("a number");
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    cluster.wait_for_leader(WAIT).await;
    let d = dispatch_client(&cluster.endpoints());

    // coord's datasets, jobs and split positions, under the ids the old build gave them.
    let def = d
        .get_dataset_def(pb::GetDatasetDefRequest {
            dataset_id: n(&e["dataset"]),
        })
        .await
        .expect("the dataset is served")
        .dataset;
    assert_eq!(def, Some(range(0, 100)));
    let listed = jobs(&d).await;
    let find = |job: &Value| {
        listed
            .iter()
            .find(|j| j.job_id == n(job))
            .unwrap_or_else(|| panic!("job {job} is not listed: {listed:?}"))
            .clone()
    };
    let dynamic = find(&e["dynamic"]["job"]);
    let leased: Vec<u64> = e["dynamic"]["leased"]
        .as_array()
        .expect("leased")
        .iter()
        .map(n)
        .collect();
    assert_eq!(
        leased,
        (0..10).collect::<Vec<_>>(),
        "what the old build handed out"
    );
    assert_eq!(dynamic.job_name.as_deref(), Some("upgrade-dynamic"));
    assert_eq!(dynamic.next_split, 10, "{dynamic:?}");
    assert_eq!(dynamic.delivered_splits, 4, "{dynamic:?}");
    assert_eq!(dynamic.leased_splits, 6, "{dynamic:?}");
    assert_eq!(dynamic.total_splits, 100);
    let off = find(&e["off"]["job"]);
    assert_eq!(
        (off.job_name.as_deref(), off.mode),
        (Some("upgrade-off"), 0)
    );
    let after = find(&e["after"]["job"]);
    assert_eq!((after.next_split, after.leased_splits), (4, 4), "{after:?}");
    // The data worker is the same registration, with the same tasks.
    let w = &e["worker"];
    let beat = data_worker(
        &d,
        w["address"].as_str().expect("address"),
        vec![n(&e["dynamic"]["task"]), n(&e["after"]["task"])],
    )
    .await;
    assert_eq!(beat.worker_id, n(&w["registration"]));
    assert!(beat.tasks_to_delete.is_empty(), "{beat:?}");
    let off_task = beat.new_tasks.iter().find(|t| t.job_id == off.job_id);
    assert!(
        off_task.is_some(),
        "the OFF job's task is still the worker's: {beat:?}"
    );
    // Leases go on where they stood: delivered ones end, the next split is 10.
    let task = n(&e["dynamic"]["task"]);
    assert_eq!(lease(&d, task, leased[4..].to_vec(), 2).await, vec![10, 11]);
    assert_eq!(lease(&d, n(&e["after"]["task"]), vec![], 1).await, vec![4]);
    // Clients are known by their ids.
    let hb = d
        .client_heartbeat(pb::ClientHeartbeatRequest {
            client_id: n(&e["dynamic"]["client"]),
            ..Default::default()
        })
        .await
        .expect("the job's client is known");
    assert_eq!(hb.job_id, dynamic.job_id);
    // Registering the same definition finds it.
    let again = d
        .get_or_register_dataset(pb::GetOrRegisterDatasetRequest {
            dataset: Some(range(0, 100)),
        })
        .await
        .expect("dataset");
    assert_eq!((again.dataset_id, again.created), (n(&e["dataset"]), false));

    // TensorFlow's dispatcher: its dataset, job and iteration, and the split position.
    let tf_e = &e["tf"];
    let mut t = tf_client(&cluster).await;
    let tf_splits: Vec<i64> = tf_e["splits"]
        .as_array()
        .expect("splits")
        .iter()
        .map(|v| v.as_i64().expect("a split"))
        .collect();
    assert_eq!(
        tf_splits,
        vec![0, 1, 2, 3, 4],
        "what the old build handed out"
    );
    let iteration = tf_e["iteration"].as_i64().expect("iteration");
    assert_eq!(tf_split(&mut t, iteration).await, Some(5));
    let graph = t
        .get_dataset_def(tf::GetDatasetDefRequest {
            dataset_id: tf_e["dataset"].as_str().expect("dataset").into(),
        })
        .await
        .expect("the TF dataset is served")
        .into_inner()
        .dataset_def;
    assert_eq!(graph, Some(range_10_graph()));
    let job = t
        .get_or_create_job(tf::GetOrCreateJobRequest {
            dataset_id: tf_e["dataset"].as_str().expect("dataset").into(),
            processing_mode_def: Some(tf::ProcessingModeDef { sharding_policy: 1 }),
            optional_job_name: Some(tf::get_or_create_job_request::OptionalJobName::JobName(
                "tf-upgrade".into(),
            )),
            ..Default::default()
        })
        .await
        .expect("the named job is found")
        .into_inner()
        .job_id;
    assert_eq!(Some(job), tf_e["job"].as_i64());
    // New objects number on from TensorFlow's bases, past the old ones.
    let fresh = d
        .get_or_register_dataset(pb::GetOrRegisterDatasetRequest {
            dataset: Some(range(0, 7)),
        })
        .await
        .expect("dataset");
    assert!(fresh.created && fresh.dataset_id >= 1000, "{fresh:?}");
}

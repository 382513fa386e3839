//! coord-proxy's split leases (`agent/src/proxy/splits.rs`), seen from outside: TensorFlow's
//! GetSplit calls, made raw through two `coord-proxy`s as two hosts' workers make them, over one
//! DYNAMIC iteration of `range(N)` on a 3-replica ensemble. (TensorFlow itself reads through
//! leases in `tfdata_wire.rs` and `tfdata_faults.rs`; here the pace of the calls is the test's.)
//!
//! - Splits asked for slowly go one at a time, so two hosts take turns, as under TensorFlow's own
//!   dispatcher (a lease of many slow splits, files say, would starve the other host).
//! - Splits asked for fast are leased in bulk (few journal entries for many splits), up to the
//!   proxy's `--tfdata-split-lease`, and still every split is handed out exactly once, in order.

use std::time::Duration;

use coord_proto::tensorflow::attr_value::Value as AttrV;
use coord_proto::tensorflow::data::dispatcher_service_client::DispatcherServiceClient;
use coord_proto::tensorflow::data::{
    get_or_create_job_request, DatasetDef, GetOrCreateIterationRequest, GetOrCreateJobRequest,
    GetOrRegisterDatasetRequest, GetSplitRequest, ProcessingModeDef, WorkerHeartbeatRequest,
};
use coord_proto::tensorflow::TensorProto;
use coord_tests::cli::coordctl_json;
use coord_tests::jax::Sidecar;
use coord_tests::{Cluster, ClusterOptions};
use prost::Message;
use tonic::transport::Channel;

const PATIENCE: Duration = Duration::from_secs(60);
/// TensorFlow's `ShardingPolicy::DYNAMIC`.
const DYNAMIC: i32 = 1;
/// A worker address nothing listens on: the task pushed to it fails at once, as intended.
const FAKE_WORKER: &str = "127.0.0.1:1";

type Dispatcher = DispatcherServiceClient<Channel>;

async fn connect(addr: &str) -> Dispatcher {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .expect("an address")
        .connect()
        .await
        .expect("coord-proxy answers");
    DispatcherServiceClient::new(channel)
}

/// An int64 scalar, as TF sends it (in `int64_val` or little-endian in `tensor_content`).
fn int64_of(t: &TensorProto) -> Option<i64> {
    if let Some(&v) = t.int64_val.first() {
        return Some(v);
    }
    let bytes: [u8; 8] = t.tensor_content.get(..8)?.try_into().ok()?;
    Some(i64::from_le_bytes(bytes))
}

/// `tf.data.Dataset.range(n)` as TF 2.21's client registers it: the captured `range(10)` with
/// its stop constant set to `n`.
fn range_def(n: i64) -> DatasetDef {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../proto/tests/fixtures/tf_datasets/range_10.pb"
    );
    let bytes = std::fs::read(path).expect("the range(10) fixture");
    let mut def = DatasetDef::decode(bytes.as_slice()).expect("a DatasetDef");
    let graph = def.graph.as_mut().expect("a graph");
    let range = graph.node.iter().find(|n| n.op == "RangeDataset");
    let stop = range.expect("a RangeDataset node").input[1].clone();
    let node = graph.node.iter_mut().find(|n| n.name == stop);
    let value = node.expect("the stop constant").attr.get_mut("value");
    let Some(AttrV::Tensor(t)) = value.and_then(|v| v.value.as_mut()) else {
        panic!("the stop constant holds no tensor")
    };
    assert_eq!(int64_of(t), Some(10), "range(10)'s stop constant");
    t.int64_val.clear();
    t.tensor_content = n.to_le_bytes().to_vec().into();
    def
}

/// A DYNAMIC iteration of `range(n)` made through `d`: its id.
async fn dynamic_iteration(d: &mut Dispatcher, n: i64) -> i64 {
    let worker = || WorkerHeartbeatRequest {
        worker_address: FAKE_WORKER.into(),
        ..Default::default()
    };
    d.worker_heartbeat(worker())
        .await
        .expect("worker registered");
    let dataset = d
        .get_or_register_dataset(GetOrRegisterDatasetRequest {
            dataset: Some(range_def(n)),
            ..Default::default()
        })
        .await
        .expect("dataset registered")
        .into_inner()
        .dataset_id;
    let job = d
        .get_or_create_job(GetOrCreateJobRequest {
            dataset_id: dataset,
            processing_mode_def: Some(ProcessingModeDef {
                sharding_policy: DYNAMIC,
            }),
            optional_job_name: Some(get_or_create_job_request::OptionalJobName::JobName(
                format!("leases-{n}"),
            )),
            ..Default::default()
        })
        .await
        .expect("job made")
        .into_inner()
        .job_id;
    let iteration = GetOrCreateIterationRequest {
        job_id: job,
        repetition: 0,
    };
    d.get_or_create_iteration(iteration)
        .await
        .expect("iteration made");
    let tasks = d.worker_heartbeat(worker()).await.expect("heartbeat");
    let tasks = tasks.into_inner().new_tasks;
    assert_eq!(tasks.len(), 1, "the fake worker's tasks: {tasks:?}");
    tasks[0].iteration_id
}

/// The next split of `iteration` through `d`: its value, or None at the end of splits.
async fn split(d: &mut Dispatcher, iteration: i64) -> Option<i64> {
    let reply = d
        .get_split(GetSplitRequest {
            iteration_id: iteration,
            repetition: 0,
            split_provider_index: 0,
        })
        .await
        .expect("GetSplit answered")
        .into_inner();
    if reply.end_of_splits {
        return None;
    }
    Some(int64_of(&reply.split.expect("a split")).expect("an int64 split"))
}

/// The `max` of every TensorFlow split lease in the journal.
fn leases_in_journal(cluster: &Cluster) -> Vec<u64> {
    let journal = coordctl_json(&cluster.endpoints(), &["dispatcher", "journal"]);
    let entries = journal["entries"].as_array().expect("entries");
    let updates = entries.iter().filter_map(|e| e["update"].as_str());
    let leases = updates.filter_map(|u| u.strip_prefix("tfdata.get_split("));
    let max = |u: &str| u.rsplit_once("max=")?.1.trim_end_matches(')').parse().ok();
    leases.map(|u| max(u).expect("a lease's max")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_splits_go_one_at_a_time_and_two_hosts_take_turns() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(PATIENCE).await;
    let hosts = [0, 1].map(|_| Sidecar::start(&cluster.endpoints()));
    let mut a = connect(&hosts[0].addr).await;
    let mut b = connect(&hosts[1].addr).await;
    let iteration = dynamic_iteration(&mut a, 1000).await;
    // Each host asks every 240 ms, more than twice the lease window (50 ms): leases stay at one.
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        got_a.push(split(&mut a, iteration).await.expect("a split"));
        tokio::time::sleep(Duration::from_millis(120)).await;
        got_b.push(split(&mut b, iteration).await.expect("a split"));
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    assert_eq!(got_a, [0, 2, 4, 6, 8, 10], "host A's splits");
    assert_eq!(got_b, [1, 3, 5, 7, 9, 11], "host B's splits");
    assert_eq!(
        leases_in_journal(&cluster),
        [1; 12],
        "one lease of one split per GetSplit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_splits_are_leased_in_bulk_each_handed_out_once_in_order() {
    const N: i64 = 5000;
    const MAX: u64 = 64;
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(PATIENCE).await;
    let proxy = Sidecar::start_with(
        &cluster.endpoints(),
        &["--tfdata-split-lease".into(), MAX.to_string()],
    );
    let mut d = connect(&proxy.addr).await;
    let iteration = dynamic_iteration(&mut d, N).await;
    // Four workers of one host, each asking again as soon as it is answered, to the end.
    let callers = (0..4).map(|_| {
        let mut d = d.clone();
        tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(s) = split(&mut d, iteration).await {
                got.push(s);
            }
            got
        })
    });
    let mut all = Vec::new();
    for caller in callers.collect::<Vec<_>>() {
        let got = caller.await.expect("a caller");
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "a worker's splits out of order: {got:?}"
        );
        all.extend(got);
    }
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>(), "every split exactly once");
    let leases = leases_in_journal(&cluster);
    eprintln!("{} leases for {N} splits: {leases:?}", leases.len());
    assert!(
        leases.iter().all(|&m| (1..=MAX).contains(&m)),
        "a lease above the maximum"
    );
    assert!(leases.contains(&MAX), "leases never grew to the maximum");
    // Mean lease of 8 or more (it starts at one and doubles while used up within 25 ms).
    assert!(
        leases.len() as i64 <= N / 8,
        "{} leases for {N} splits: they did not grow",
        leases.len()
    );
}

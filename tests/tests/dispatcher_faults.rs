//! The dispatcher survives what TF's does not: a leader kill mid-epoch, a full ensemble restart,
//! a data worker killed mid-epoch (its splits are re-issued; in a named namespace), and a worker added to a
//! round-robin job mid-job (consumers stay aligned round by round).

use std::time::Duration;

use coord_agent::data::DispatchClient;
use coord_proto::coord::admin::{DeclareNamespaceRequest, NamespaceShape};
use coord_proto::coord::dispatcher as pb;
use coord_proto::coord::dispatcher::{dataset_op, DatasetOp, RepeatOp};
use coord_proto::dataset::{range, range_value};
use coord_tests::data::{
    assert_exactly, consumer, dispatch_client, dispatch_client_in, job, jobs, read_values,
    wait_workers, WorkerProc,
};
use coord_tests::{Cluster, ClusterOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_mid_epoch_loses_and_repeats_no_split() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let _workers: Vec<WorkerProc> = (0..2).map(|_| WorkerProc::start(&eps, 100)).collect();
    wait_workers(&d, 2).await;
    let n = 3000;
    let (j, c) = job(&d, range(0, n), pb::ProcessingMode::Dynamic, None, None)
        .await
        .unwrap();
    let mut r = consumer(&d, j, c, false, None).await;
    let mut got = read_values(&mut r, 1000).await.unwrap();
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    cluster.kill(leader);
    got.extend(read_values(&mut r, usize::MAX).await.unwrap());
    // The raw stream, no dedupe: no split was handed out twice, none was lost.
    assert_exactly(&got, 0..n, 1, "DYNAMIC across a leader kill");
    cluster.spawn(leader);
    let info = jobs(&d).await.into_iter().find(|i| i.job_id == j).unwrap();
    assert!(info.finished && info.next_split == n as u64, "{info:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_restart_restores_jobs_tasks_and_positions() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let _workers: Vec<WorkerProc> = (0..2).map(|_| WorkerProc::start(&eps, 100)).collect();
    wait_workers(&d, 2).await;
    let n = 2000;
    let (j, c) = job(
        &d,
        range(0, n),
        pb::ProcessingMode::Dynamic,
        Some("epoch"),
        None,
    )
    .await
    .unwrap();
    let mut r = consumer(&d, j, c, false, None).await;
    let mut got = read_values(&mut r, 700).await.unwrap();
    let before = jobs(&d).await;
    for id in cluster.ids() {
        cluster.kill(id);
    }
    for id in cluster.ids() {
        cluster.spawn(id);
    }
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let after = jobs(&d).await;
    let (b, a) = (&before[0], &after[0]);
    assert_eq!(
        (a.job_id, &a.job_name, a.dataset_id, a.tasks),
        (b.job_id, &b.job_name, b.dataset_id, b.tasks)
    );
    assert!(
        a.next_split >= b.next_split,
        "split position went back: {b:?} -> {a:?}"
    );
    // The same consumer, the same job, the same workers carry on.
    got.extend(read_values(&mut r, usize::MAX).await.unwrap());
    assert_exactly(&got, 0..n, 1, "DYNAMIC across a full restart");
    // Joining the named job again finds it, with its id.
    let (again, _) = job(
        &d,
        range(0, n),
        pb::ProcessingMode::Dynamic,
        Some("epoch"),
        None,
    )
    .await
    .unwrap_err_or_finished(j);
    assert_eq!(again, j);
}

/// `job` on a finished named job is FAILED_PRECONDITION naming it; otherwise its id.
trait FinishedJob {
    fn unwrap_err_or_finished(self, job: u64) -> (u64, u64);
}

impl FinishedJob for Result<(u64, u64), tonic::Status> {
    fn unwrap_err_or_finished(self, job: u64) -> (u64, u64) {
        match self {
            Ok(r) => r,
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
                assert!(
                    e.message().contains(&format!("id {job}")),
                    "{}",
                    e.message()
                );
                (job, 0)
            }
        }
    }
}

/// In a named namespace, beside a default namespace whose own worker lives: the leader's timers
/// judge every namespace's workers, and only that namespace's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_workers_splits_are_reissued() {
    const NS: &str = "data-a";
    let cluster = Cluster::start(ClusterOptions {
        extra_args: vec!["--dispatcher-worker-timeout-ms".into(), "1500".into()],
        ..ClusterOptions::default()
    });
    let eps = cluster.endpoints();
    let default = dispatch_client(&eps);
    default
        .coord()
        .declare_namespace(DeclareNamespaceRequest {
            name: NS.into(),
            shape: Some(NamespaceShape::default()),
            limits: None,
        })
        .await
        .expect("declare");
    let _default_worker = WorkerProc::start(&eps, 100);
    wait_workers(&default, 1).await;
    let d = dispatch_client_in(&eps, Some(NS));
    let mut doomed = WorkerProc::start_in(&eps, 100, Some(NS));
    let _survivor = WorkerProc::start_in(&eps, 100, Some(NS));
    wait_workers(&d, 2).await;
    let n = 3000;
    let mut def = range(0, n);
    def.records_per_split = 10;
    let (j, c) = job(&d, def, pb::ProcessingMode::Dynamic, None, None)
        .await
        .unwrap();
    let mut r = consumer(&d, j, c, true, None).await;
    let mut got = read_values(&mut r, 800).await.unwrap();
    doomed.kill();
    got.extend(read_values(&mut r, usize::MAX).await.unwrap());
    // Deduplicated by element identity: exactly once.
    assert_exactly(&got, 0..n, 1, "DYNAMIC with a worker killed");
    let info = jobs(&d).await.into_iter().find(|i| i.job_id == j).unwrap();
    assert!(info.finished, "{info:?}");
    assert!(
        info.reissued_splits > 0,
        "the killed worker held leased splits; they must be handed out again: {info:?}"
    );
    assert!(
        journal(&d)
            .await
            .iter()
            .any(|e| e.update.contains("worker_timeout")),
        "the dead worker was declared dead"
    );
    assert!(
        !journal(&default)
            .await
            .iter()
            .any(|e| e.update.contains("worker_timeout") || e.update.contains(&doomed.address)),
        "the default namespace's journal holds none of it"
    );
    let workers = default
        .get_workers(pb::GetWorkersRequest {})
        .await
        .unwrap()
        .workers;
    assert!(
        workers.len() == 1 && workers[0].alive,
        "the default namespace's worker alone, alive: {workers:?}"
    );
    eprintln!(
        "splits re-issued: {}, duplicates dropped by the consumer: {}",
        info.reissued_splits, r.duplicates
    );
}

/// The first 10,000 entries of `d`'s namespace's dispatcher journal.
async fn journal(d: &DispatchClient) -> Vec<pb::JournalEntry> {
    d.journal(pb::JournalRequest {
        from_index: 0,
        limit: 10_000,
    })
    .await
    .expect("journal")
    .entries
}

fn infinite(n: i64) -> pb::DatasetDef {
    let mut def = range(0, n);
    def.ops = vec![DatasetOp {
        kind: Some(dataset_op::Kind::Repeat(RepeatOp { count: 0 })),
    }];
    def
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_consumers_stay_aligned_when_a_worker_joins() {
    let cluster = Cluster::start(ClusterOptions::default());
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let _first = WorkerProc::start(&eps, 100);
    wait_workers(&d, 1).await;
    let (j, c0) = job(
        &d,
        infinite(1_000_000),
        pb::ProcessingMode::Off,
        Some("rr"),
        Some(2),
    )
    .await
    .unwrap();
    let (_, c1) = job(
        &d,
        infinite(1_000_000),
        pb::ProcessingMode::Off,
        Some("rr"),
        Some(2),
    )
    .await
    .unwrap();
    let mut a = consumer(&d, j, c0, false, Some(0)).await;
    let mut b = consumer(&d, j, c1, false, Some(1)).await;
    let mut second = None;
    let mut rounds: Vec<(i64, i64)> = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // Read until rounds come from the new worker's task (its values start again from 0).
    let mut switched_at = None;
    while switched_at.is_none() || rounds.len() < switched_at.unwrap_or(0) + 20 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new task was never read; rounds: {}",
            rounds.len()
        );
        let (x, y) = tokio::join!(a.next(), b.next());
        let (x, y) = (x.unwrap().unwrap(), y.unwrap().unwrap());
        let pair = (range_value(&x.data).unwrap(), range_value(&y.data).unwrap());
        if rounds.len() == 50 {
            second = Some(WorkerProc::start(&eps, 100));
        }
        if let Some(&(prev, _)) = rounds.last() {
            if switched_at.is_none() && pair.0 < prev {
                switched_at = Some(rounds.len());
            }
        }
        rounds.push(pair);
    }
    // Every round: both consumers read the same task's round (consecutive elements of it).
    for (r, (x, y)) in rounds.iter().enumerate() {
        assert_eq!(
            *y,
            x + 1,
            "round {r}: consumers read different tasks: {x} and {y}"
        );
    }
    let info = jobs(&d).await.into_iter().find(|i| i.job_id == j).unwrap();
    assert_eq!((info.tasks, info.pending_tasks), (2, 0), "{info:?}");
    assert_eq!(a.round(), b.round());
    drop(second);
}

//! The tf.data dispatcher on a 3-replica ensemble with real `data-worker` processes: every
//! processing mode end to end with exact multiset checks, bad input, and the journal.
//! (Failures — leader kill, full restart, worker kill — are in `dispatcher_faults.rs`.)

use std::time::Duration;

use coord_proto::coord::dispatcher as pb;
use coord_proto::coord::dispatcher::{dataset_op, DatasetOp, FilterOp, RepeatOp};
use coord_proto::dataset::range;
use coord_tests::cli::coordctl_json;
use coord_tests::data::{
    assert_exactly, consumer, dispatch_client, job, jobs, read_values, wait_workers, WorkerProc,
};
use coord_tests::{Cluster, ClusterOptions};
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_processing_mode_end_to_end() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let _workers: Vec<WorkerProc> = (0..3).map(|_| WorkerProc::start(&eps, 100)).collect();
    wait_workers(&d, 3).await;

    // DYNAMIC: one split per element, two consumers share the job; together they see each
    // element exactly once (no dedupe: the raw stream).
    let (j, c1) = job(
        &d,
        range(0, 600),
        pb::ProcessingMode::Dynamic,
        Some("dyn"),
        None,
    )
    .await
    .unwrap();
    let (j2, c2) = job(
        &d,
        range(0, 600),
        pb::ProcessingMode::Dynamic,
        Some("dyn"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(j, j2, "the named job is shared");
    let mut a = consumer(&d, j, c1, false, None).await;
    let mut b = consumer(&d, j, c2, false, None).await;
    let (va, vb) = tokio::join!(
        read_values(&mut a, usize::MAX),
        read_values(&mut b, usize::MAX)
    );
    let (va, vb) = (va.unwrap(), vb.unwrap());
    assert!(
        !va.is_empty() && !vb.is_empty(),
        "both consumers read: {} and {}",
        va.len(),
        vb.len()
    );
    assert_exactly(&[va, vb].concat(), 0..600, 1, "DYNAMIC");
    let info = jobs(&d).await.into_iter().find(|i| i.job_id == j).unwrap();
    assert!(info.finished, "{info:?}");
    assert_eq!((info.next_split, info.leased_splits), (600, 0), "{info:?}");

    // OFF: every worker produces the whole dataset.
    let mut def = range(0, 200);
    def.records_per_split = 7;
    let (j, c) = job(&d, def.clone(), pb::ProcessingMode::Off, None, None)
        .await
        .unwrap();
    let mut r = consumer(&d, j, c, false, None).await;
    assert_exactly(
        &read_values(&mut r, usize::MAX).await.unwrap(),
        0..200,
        3,
        "OFF",
    );

    // FILE: worker i of 3 takes splits i, i+3, ...; DATA: records i, i+3, ... With a filter and
    // two epochs.
    def.ops = vec![
        DatasetOp {
            kind: Some(dataset_op::Kind::Filter(FilterOp {
                modulo: 3,
                remainder: 1,
            })),
        },
        DatasetOp {
            kind: Some(dataset_op::Kind::Repeat(RepeatOp { count: 2 })),
        },
    ];
    for mode in [pb::ProcessingMode::File, pb::ProcessingMode::Data] {
        let (j, c) = job(&d, def.clone(), mode, None, None).await.unwrap();
        let mut r = consumer(&d, j, c, false, None).await;
        let got = read_values(&mut r, usize::MAX).await.unwrap();
        assert_exactly(
            &got,
            (0..200).filter(|v| v % 3 == 1),
            2,
            &format!("{mode:?}"),
        );
        let tasks = jobs(&d)
            .await
            .into_iter()
            .find(|i| i.job_id == j)
            .unwrap()
            .tasks;
        assert_eq!(tasks, 3, "{mode:?}: one shard per worker");
    }

    // What an operator sees: coordctl and /metrics.
    let jobs_json = coordctl_json(&eps, &["dispatcher", "jobs"]);
    let rows = jobs_json.as_array().expect("an array of jobs");
    assert_eq!(rows.len(), 4, "{jobs_json}");
    let dynamic = rows
        .iter()
        .find(|r| r["name"] == "dyn")
        .expect("the named job");
    assert_eq!(
        (dynamic["mode"].as_str(), dynamic["splits"].as_str()),
        (Some("DYNAMIC"), Some("600/600"))
    );
    assert!(rows.iter().all(|r| r["finished"] == true), "{jobs_json}");
    let workers = coordctl_json(&eps, &["dispatcher", "workers"]);
    assert_eq!(
        workers
            .as_array()
            .map(|w| w.iter().filter(|w| w["alive"] == true).count()),
        Some(3),
        "{workers}"
    );
    let journal = coordctl_json(&eps, &["dispatcher", "journal", "--limit", "100000"]);
    let lines = journal["entries"].as_array().expect("entries");
    let splits = lines
        .iter()
        .filter(|e| {
            e["update"]
                .as_str()
                .is_some_and(|u| u.starts_with("get_split"))
        })
        .count();
    // Every GetSplit is a journal line; a data worker leases up to 8 splits per GetSplit.
    assert!(
        splits * 8 >= 600,
        "600 splits were handed out in {splits} GetSplits"
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let (_, metrics) = coord_tests::http::get(cluster.replica(leader).http, "/metrics").unwrap();
    assert!(
        metrics.contains("coord_dispatcher_splits_total{kind=\"handed_out\"} 600"),
        "{metrics}"
    );
    assert!(metrics.contains("coord_dispatcher_workers{state=\"alive\"} 3"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_by_name_and_changes_nothing() {
    let cluster = Cluster::start(ClusterOptions::default());
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let (j, _) = job(
        &d,
        range(0, 10),
        pb::ProcessingMode::Dynamic,
        Some("n"),
        None,
    )
    .await
    .unwrap();
    let state = |d: coord_agent::data::DispatchClient| async move {
        d.list_jobs(pb::ListJobsRequest {}).await.unwrap()
    };
    let before = state(d.clone()).await;

    let mut bad_def = range(0, 10);
    bad_def.sources[0].kind = Some(pb::source::Kind::Range(pb::RangeSource {
        start: 0,
        end: 10,
        step: -1,
    }));
    let e = d
        .get_or_register_dataset(pb::GetOrRegisterDatasetRequest {
            dataset: Some(bad_def),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("source 0") && e.message().contains("step"),
        "{}",
        e.message()
    );

    let e = d
        .get_or_create_job(pb::GetOrCreateJobRequest {
            dataset_id: 4242,
            mode: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("dataset 4242"), "{}", e.message());

    let other = d
        .get_or_register_dataset(pb::GetOrRegisterDatasetRequest {
            dataset: Some(range(0, 11)),
        })
        .await
        .unwrap()
        .dataset_id;
    let mut before = before;
    before.applied_updates += 1;
    let e = d
        .get_or_create_job(pb::GetOrCreateJobRequest {
            dataset_id: other,
            mode: pb::ProcessingMode::Off as i32,
            job_name: Some("n".into()),
            num_consumers: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("\"n\"") && e.message().contains(&format!("job {j}"))
            || e.message().contains(&format!("id {j}")),
        "{}",
        e.message()
    );

    let e = d
        .get_or_create_job(pb::GetOrCreateJobRequest {
            dataset_id: other,
            mode: 9,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("processing mode 9"), "{}", e.message());

    for (e, what) in [
        (
            d.get_split(pb::GetSplitRequest {
                task_id: 777,
                splits_done: vec![],
                max_splits: 1,
            })
            .await
            .unwrap_err(),
            "task 777",
        ),
        (
            d.client_heartbeat(pb::ClientHeartbeatRequest {
                client_id: 778,
                ..Default::default()
            })
            .await
            .unwrap_err(),
            "job client 778",
        ),
        (
            d.release_job_client(pb::ReleaseJobClientRequest { client_id: 779 })
                .await
                .unwrap_err(),
            "job client 779",
        ),
        (
            d.get_dataset_def(pb::GetDatasetDefRequest { dataset_id: 780 })
                .await
                .unwrap_err(),
            "dataset 780",
        ),
    ] {
        assert_eq!(e.code(), Code::NotFound, "{what}: {e:?}");
        assert!(e.message().contains(what), "{what}: {}", e.message());
    }
    // The one accepted update above (registering the second dataset) is the only change.
    assert_eq!(state(d.clone()).await, before, "refusals changed nothing");
    // Every update is in the journal, one line each, refused ones included (they were decided
    // by the replicated apply, and changed nothing).
    let journal = d
        .journal(pb::JournalRequest::default())
        .await
        .unwrap()
        .entries;
    assert!(
        journal
            .iter()
            .any(|e| e.update.contains("get_or_create_job(dataset=4242")),
        "{journal:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_released_and_its_job_collected() {
    let cluster = Cluster::start(ClusterOptions {
        extra_args: [
            "--dispatcher-client-timeout-ms",
            "1000",
            "--dispatcher-job-gc-timeout-ms",
            "1000",
        ]
        .map(String::from)
        .into(),
        ..ClusterOptions::default()
    });
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let _worker = WorkerProc::start(&eps, 100);
    wait_workers(&d, 1).await;
    // A client that never heartbeats (its process died right after GetOrCreateJob).
    let (j, c) = job(
        &d,
        range(0, 1_000_000),
        pb::ProcessingMode::Off,
        Some("abandoned"),
        None,
    )
    .await
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let info = loop {
        let info = jobs(&d).await.into_iter().find(|i| i.job_id == j).unwrap();
        if info.finished {
            break info;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never collected: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!((info.clients, info.tasks), (0, 0), "{info:?}");
    let e = d
        .client_heartbeat(pb::ClientHeartbeatRequest {
            client_id: c,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "the client was released: {e:?}");
    // The task is gone from the worker's count (and from its next heartbeat's task list).
    loop {
        let w = d
            .get_workers(pb::GetWorkersRequest {})
            .await
            .unwrap()
            .workers;
        if w[0].tasks == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{w:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let journal = d
        .journal(pb::JournalRequest::default())
        .await
        .unwrap()
        .entries;
    let updates: Vec<&str> = journal.iter().map(|e| e.update.as_str()).collect();
    assert!(
        updates
            .iter()
            .any(|u| u.starts_with(&format!("client_timeout({c})"))),
        "{updates:?}"
    );
    assert!(
        updates
            .iter()
            .any(|u| u.starts_with(&format!("collect_job({j})"))),
        "{updates:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_files_end_to_end_and_a_damaged_file_is_reported() {
    let cluster = Cluster::start(ClusterOptions::default());
    let eps = cluster.endpoints();
    let d = dispatch_client(&eps);
    let _workers: Vec<WorkerProc> = (0..2).map(|_| WorkerProc::start(&eps, 100)).collect();
    wait_workers(&d, 2).await;
    let dir = tempfile::tempdir().unwrap();
    let mut shards = Vec::new();
    let mut want = Vec::new();
    for f in 0..3 {
        let records: Vec<String> = (0..50).map(|i| format!("file{f}-record{i}")).collect();
        want.extend(records.iter().cloned());
        let refs: Vec<&[u8]> = records.iter().map(|r| r.as_bytes()).collect();
        shards.push(
            coord_proto::dataset::write_record_file(&dir.path().join(format!("{f}.rec")), &refs)
                .unwrap(),
        );
    }
    let def = pb::DatasetDef {
        sources: vec![pb::Source {
            kind: Some(pb::source::Kind::Files(pb::FilesSource {
                shards: shards.clone(),
            })),
        }],
        ops: vec![],
        records_per_split: 10,
    };
    let (j, c) = job(&d, def.clone(), pb::ProcessingMode::Dynamic, None, None)
        .await
        .unwrap();
    let mut r = consumer(&d, j, c, false, None).await;
    let mut got = Vec::new();
    while let Some(e) = r.next().await.unwrap() {
        got.push(String::from_utf8(e.data.to_vec()).unwrap());
    }
    got.sort();
    want.sort();
    assert_eq!(got, want, "every record of every file once");

    // A shard whose checksum does not match: the task fails and the consumer hears why.
    let mut damaged = def;
    if let Some(pb::source::Kind::Files(f)) = &mut damaged.sources[0].kind {
        f.shards[1].crc32c ^= 1;
    }
    let (j, c) = job(&d, damaged, pb::ProcessingMode::Off, None, None)
        .await
        .unwrap();
    let mut r = consumer(&d, j, c, false, None).await;
    let err = loop {
        match r.next().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a damaged file was read to the end"),
            Err(e) => break e,
        }
    };
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("1.rec") && err.message().contains("CRC-32C"),
        "{}",
        err.message()
    );
}

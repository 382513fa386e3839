//! coord's protocol over the same state: definitions deduped by fingerprint, jobs read once,
//! leased splits that come back when their worker dies, static sharding, round-robin reads.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::*;

fn ok(s: &mut DispatcherState, o: DispatcherOp) -> DispatcherOutput {
    match op(s, o.clone()) {
        Ok(out) => out,
        other => panic!("{o} gave {other:?}"),
    }
}

fn refused(s: &mut DispatcherState, o: DispatcherOp) -> (Code, String) {
    let r = op(s, o);
    (code(r.clone()), message(r))
}

fn dataset(s: &mut DispatcherState, fingerprint: u64, total: Option<u64>) -> String {
    match ok(
        s,
        DispatcherOp::RegisterDefinition {
            fingerprint,
            def: Bytes::from_static(b"def"),
            total_splits: total,
        },
    ) {
        DispatcherOutput::Definition { id, .. } => id,
        o => panic!("{o:?}"),
    }
}

fn data_worker(s: &mut DispatcherState, address: &str) -> u64 {
    data_worker_at(s, address, BTreeMap::new())
}

fn data_worker_at(s: &mut DispatcherState, address: &str, rounds: BTreeMap<i64, i64>) -> u64 {
    match ok(
        s,
        DispatcherOp::RegisterDataWorker {
            address: address.into(),
            rounds,
        },
    ) {
        DispatcherOutput::Registered(r) => r,
        o => panic!("{o:?}"),
    }
}

fn join(s: &mut DispatcherState, dataset: &str, mode: i32, name: Option<&str>) -> (i64, i64) {
    join_with(s, dataset, mode, name, None)
}

fn join_with(
    s: &mut DispatcherState,
    dataset: &str,
    mode: i32,
    name: Option<&str>,
    consumers: Option<i64>,
) -> (i64, i64) {
    match ok(s, join_op(dataset, mode, name, consumers)) {
        DispatcherOutput::Iteration {
            iteration, client, ..
        } => (iteration, client),
        o => panic!("{o:?}"),
    }
}

fn join_op(dataset: &str, mode: i32, name: Option<&str>, consumers: Option<i64>) -> DispatcherOp {
    DispatcherOp::JoinJob {
        dataset: dataset.into(),
        sharding: mode,
        name: name.map(str::to_string),
        anonymous_tag: 0,
        num_consumers: consumers,
    }
}

fn lease(s: &mut DispatcherState, task: i64, done: Vec<u64>, max: u32) -> LeaseAnswer {
    match ok(s, DispatcherOp::LeaseSplits { task, done, max }) {
        DispatcherOutput::Lease(a) => a,
        o => panic!("{o:?}"),
    }
}

fn leases(s: &DispatcherState, job: i64) -> &Leases {
    s.iterations[&job].providers.as_ref().expect("providers")[0]
        .leases
        .as_ref()
        .expect("leases")
}

fn timeout(s: &mut DispatcherState, address: &str, registration: u64) {
    ok(
        s,
        DispatcherOp::DataWorkerTimeout {
            address: address.into(),
            registration,
        },
    );
}

#[test]
fn definitions_dedupe_by_fingerprint() {
    let mut s = DispatcherState::default();
    let a = dataset(&mut s, 7, Some(3));
    let b = dataset(&mut s, 7, Some(3));
    let c = dataset(&mut s, 8, Some(3));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a, "1000", "TensorFlow's ids");
}

#[test]
fn a_named_job_must_match() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    let other = dataset(&mut s, 2, Some(10));
    data_worker(&mut s, "w1");
    let (j1, c1) = join(&mut s, &d, sharding::DYNAMIC, Some("train"));
    let (j2, c2) = join(&mut s, &d, sharding::DYNAMIC, Some("train"));
    assert_eq!(j1, j2);
    assert_ne!(c1, c2);
    let (code, msg) = refused(&mut s, join_op(&other, sharding::OFF, Some("train"), None));
    assert_eq!(code, Code::InvalidArgument);
    assert!(
        msg.contains("\"train\"") && msg.contains("dataset") && msg.contains("DYNAMIC"),
        "{msg}"
    );
    let (code, msg) = refused(&mut s, join_op("999", sharding::OFF, None, None));
    assert_eq!((code, msg.contains("dataset 999")), (Code::NotFound, true));
}

#[test]
fn splits_are_handed_out_once_and_dead_workers_leases_come_back() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(5));
    data_worker(&mut s, "w1");
    let w2 = data_worker(&mut s, "w2");
    let (j, _) = join(&mut s, &d, sharding::DYNAMIC, None);
    let tasks = s.iterations[&j].tasks.clone();
    let (t1, t2) = (tasks[0], tasks[1]);
    let mut given = Vec::new();
    for t in [t1, t2, t1, t2] {
        if let LeaseAnswer::Splits(x) = lease(&mut s, t, vec![], 1) {
            given.push((t, x[0]));
        }
    }
    assert_eq!(given.iter().map(|g| g.1).collect::<Vec<_>>(), [0, 1, 2, 3]);
    // t1 delivered its splits; w2 dies holding 1 and 3.
    assert_eq!(
        lease(&mut s, t1, vec![0, 2], 1),
        LeaseAnswer::Splits(vec![4])
    );
    timeout(&mut s, "w2", w2);
    let (code, _) = refused(
        &mut s,
        DispatcherOp::LeaseSplits {
            task: t2,
            done: vec![],
            max: 1,
        },
    );
    assert_eq!(code, Code::FailedPrecondition);
    assert_eq!(lease(&mut s, t1, vec![4], 1), LeaseAnswer::Splits(vec![1]));
    assert_eq!(lease(&mut s, t1, vec![1], 1), LeaseAnswer::Splits(vec![3]));
    assert_eq!(lease(&mut s, t1, vec![], 1), LeaseAnswer::EndOfSplits);
    assert!(!s.iterations[&j].finished, "split 3 is not delivered yet");
    ok(
        &mut s,
        DispatcherOp::ReportDelivery {
            address: "w1".into(),
            done: vec![(t1, 3)],
            completed: vec![t1],
        },
    );
    assert!(s.iterations[&j].finished);
    assert_eq!(leases(&s, j).delivered, 5);
    assert_eq!(leases(&s, j).reissued, 2);
    assert_eq!(s.splits_handed_out, 5, "re-issued splits are not new");
}

#[test]
fn a_task_waits_while_others_hold_leases() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(1));
    data_worker(&mut s, "a");
    data_worker(&mut s, "b");
    let (j, _) = join(&mut s, &d, sharding::DYNAMIC, None);
    let t = s.iterations[&j].tasks.clone();
    assert_eq!(lease(&mut s, t[0], vec![], 1), LeaseAnswer::Splits(vec![0]));
    assert_eq!(lease(&mut s, t[1], vec![], 1), LeaseAnswer::Retry);
    assert_eq!(lease(&mut s, t[0], vec![0], 1), LeaseAnswer::EndOfSplits);
    assert_eq!(lease(&mut s, t[1], vec![], 1), LeaseAnswer::EndOfSplits);
}

#[test]
fn a_worker_joining_gets_a_task_for_every_unfinished_job() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    let (j1, _) = join(&mut s, &d, sharding::DYNAMIC, None);
    let (j2, _) = join(&mut s, &d, sharding::OFF, None);
    assert!(s.iterations[&j1].tasks.is_empty());
    data_worker(&mut s, "late");
    assert_eq!(s.iterations[&j1].tasks.len(), 1);
    assert_eq!(s.iterations[&j2].tasks.len(), 1);
    // Registering again while alive changes nothing.
    let before = s.tasks.len();
    data_worker(&mut s, "late");
    assert_eq!(s.tasks.len(), before);
}

#[test]
fn static_sharding_needs_workers() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    let (code, msg) = refused(&mut s, join_op(&d, sharding::FILE, None, None));
    assert_eq!(code, Code::FailedPrecondition, "{msg}");
    data_worker(&mut s, "a");
    data_worker(&mut s, "b");
    let (j, _) = join(&mut s, &d, sharding::DATA, None);
    let shards: BTreeSet<u64> = s.iterations[&j]
        .tasks
        .iter()
        .map(|t| s.tasks[t].shard_index)
        .collect();
    assert_eq!(shards, BTreeSet::from([0, 1]));
    assert_eq!(s.iterations[&j].num_shards, 2);
    // A worker that comes later gets no shard of it.
    data_worker(&mut s, "c");
    assert_eq!(s.iterations[&j].tasks.len(), 2);
}

#[test]
fn round_robin_needs_off_and_an_infinite_dataset() {
    let mut s = DispatcherState::default();
    let finite = dataset(&mut s, 1, Some(10));
    let infinite = dataset(&mut s, 2, None);
    for (dataset, mode, want) in [
        (&finite, sharding::OFF, "infinite"),
        (&infinite, sharding::DYNAMIC, "OFF"),
    ] {
        let (code, msg) = refused(&mut s, join_op(dataset, mode, None, Some(2)));
        assert_eq!(code, Code::InvalidArgument);
        assert!(msg.contains(want), "{msg}");
    }
}

/// The example in the comments of TensorFlow's tf.data dispatcher (`DataServiceDispatcherImpl`),
/// step by step, as coord's consumers see it: the round they are told to block before is the
/// pending task's target.
#[test]
fn pending_task_protocol_follows_tensorflows_example() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, None);
    data_worker(&mut s, "w1");
    let (j, c1) = join_with(&mut s, &d, sharding::OFF, Some("rr"), Some(2));
    let (_, c2) = join_with(&mut s, &d, sharding::OFF, Some("rr"), Some(2));
    let beat = |s: &mut DispatcherState, client, current, blocked| {
        ok(
            s,
            DispatcherOp::ClientHeartbeat {
                client,
                current_round: Some(current),
                blocked_round: blocked,
                client_round: current,
            },
        );
        s.iterations[&j].pending.front().map(|p| p.target_round)
    };
    // 1-2. Consumers at round 50; a worker joins: target 51.
    data_worker_at(&mut s, "w2", BTreeMap::from([(j, 50)]));
    let new_task = s.iterations[&j].pending[0].task;
    assert_eq!(
        s.iteration_tasks(&s.iterations[&j]).count(),
        1,
        "pending tasks are not shown"
    );
    assert_eq!(beat(&mut s, c1, 50, None), Some(51)); // 3
    assert_eq!(beat(&mut s, c2, 51, None), Some(53)); // 4: too late for 51
    assert_eq!(beat(&mut s, c1, 50, Some(51)), Some(53)); // 5: ready for 53
    assert_eq!(beat(&mut s, c2, 52, Some(53)), None); // 6: promoted
    assert_eq!(s.tasks[&new_task].starting_round, 53);
    assert_eq!(s.iteration_tasks(&s.iterations[&j]).count(), 2);
    assert_eq!(beat(&mut s, c1, 50, Some(53)), None); // 7
}

#[test]
fn unknown_ids_are_named() {
    let mut s = DispatcherState::default();
    for (o, want) in [
        (
            DispatcherOp::LeaseSplits {
                task: 42,
                done: vec![],
                max: 1,
            },
            "task 42",
        ),
        (
            DispatcherOp::ClientTimeout {
                client: 43,
                time_micros: 0,
            },
            "client id not found: 43",
        ),
        (
            DispatcherOp::CollectJob { iteration: 44 },
            "Iteration id 44",
        ),
        (
            DispatcherOp::ReportDelivery {
                address: "nowhere:1".into(),
                done: vec![],
                completed: vec![],
            },
            "nowhere:1",
        ),
    ] {
        let (code, msg) = refused(&mut s, o);
        assert_eq!(code, Code::NotFound);
        assert!(msg.contains(want), "{msg}");
    }
}

#[test]
fn a_collected_job_ends_its_tasks() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    data_worker(&mut s, "w");
    let (j, c) = join(&mut s, &d, sharding::OFF, Some("n"));
    let (code, _) = refused(&mut s, DispatcherOp::CollectJob { iteration: j });
    assert_eq!(code, Code::FailedPrecondition, "it has a client");
    ok(
        &mut s,
        DispatcherOp::ReleaseClient {
            client: c,
            time_micros: 1_000_000,
        },
    );
    assert_eq!(s.iterations[&j].last_client_released_micros, 1_000_000);
    ok(&mut s, DispatcherOp::CollectJob { iteration: j });
    assert!(
        s.workers["w"].tasks.is_empty(),
        "no task left on the worker"
    );
    let (code, msg) = refused(&mut s, join_op(&d, sharding::OFF, Some("n"), None));
    assert_eq!(code, Code::FailedPrecondition);
    assert!(msg.contains("garbage-collected"), "{msg}");
}

#[test]
fn a_lease_takes_reissued_splits_first_and_stops_at_the_end() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, Some(10));
    data_worker(&mut s, "a");
    let wb = data_worker(&mut s, "b");
    let (j, _) = join(&mut s, &d, sharding::DYNAMIC, None);
    let t = s.iterations[&j].tasks.clone();
    assert_eq!(
        lease(&mut s, t[1], vec![], 4),
        LeaseAnswer::Splits(vec![0, 1, 2, 3])
    );
    timeout(&mut s, "b", wb);
    assert_eq!(
        lease(&mut s, t[0], vec![], 8),
        LeaseAnswer::Splits(vec![0, 1, 2, 3, 4, 5, 6, 7])
    );
    assert_eq!(
        lease(&mut s, t[0], vec![], 8),
        LeaseAnswer::Splits(vec![8, 9])
    );
    assert_eq!(leases(&s, j).reissued, 4);
}

#[test]
fn a_dead_worker_back_is_a_new_registration_with_new_tasks() {
    let mut s = DispatcherState::default();
    let d = dataset(&mut s, 1, None);
    let first = data_worker(&mut s, "w");
    let (j, _) = join(&mut s, &d, sharding::DYNAMIC, None);
    let old = s.iterations[&j].tasks[0];
    // A verdict about another registration changes nothing.
    timeout(&mut s, "w", first + 100);
    assert!(!s.workers["w"].lost);
    timeout(&mut s, "w", first);
    assert!(s.tasks[&old].removed);
    assert_eq!(s.iteration_tasks(&s.iterations[&j]).count(), 0);
    assert!(!s.iterations[&j].finished, "its splits wait for a worker");
    let again = data_worker(&mut s, "w");
    assert_ne!(again, first);
    let live: Vec<&Task> = s.iteration_tasks(&s.iterations[&j]).collect();
    assert_eq!(live.len(), 1);
    assert_ne!(live[0].id, old);
    assert_eq!(live[0].registration, again);
}

/// A dataset is produced only by the workers that can: TensorFlow's run graphs, coord's run
/// definitions. Neither surface reads the other's datasets, and no worker gets the other's tasks.
#[test]
fn each_kind_of_worker_gets_tasks_of_its_own_datasets_only() {
    let mut s = DispatcherState::default();
    let def = dataset(&mut s, 1, Some(4));
    register(&mut s, None, "m").expect("graph");
    let graph = "1001".to_string();
    data_worker(&mut s, "coord:1");
    worker(&mut s, "tf:1", &[]);
    let (j, _) = join(&mut s, &def, sharding::OFF, None);
    assert_eq!(s.iterations[&j].tasks.len(), 1);
    assert_eq!(s.tasks[&s.iterations[&j].tasks[0]].worker, "coord:1");
    let tf_job = match job(&mut s, &graph, sharding::OFF, None) {
        Ok(DispatcherOutput::Job(id)) => id,
        other => panic!("{other:?}"),
    };
    let (_, it, tasks) = iteration(&mut s, tf_job, 0, 0);
    assert_eq!(tasks.len(), 1);
    assert_eq!(s.tasks[&tasks[0]].worker, "tf:1");
    // Late workers too.
    data_worker(&mut s, "coord:2");
    worker(&mut s, "tf:2", &[]);
    assert!(s.iterations[&j]
        .tasks
        .iter()
        .all(|t| s.tasks[t].worker.starts_with("coord")));
    assert!(s.iterations[&it]
        .tasks
        .iter()
        .all(|t| s.tasks[t].worker.starts_with("tf")));
    // The other surface's datasets are refused, naming them.
    assert_eq!(
        code(job(&mut s, &def, sharding::OFF, None)),
        Code::FailedPrecondition
    );
    let (code, msg) = refused(&mut s, join_op(&graph, sharding::OFF, None, None));
    assert_eq!(code, Code::FailedPrecondition);
    assert!(msg.contains(&graph), "{msg}");
    // A worker heartbeats as the kind it registered as.
    let (code, msg) = refused(
        &mut s,
        DispatcherOp::RegisterDataWorker {
            address: "tf:1".into(),
            rounds: BTreeMap::new(),
        },
    );
    assert_eq!(code, Code::FailedPrecondition);
    assert!(msg.contains("tf:1"), "{msg}");
}

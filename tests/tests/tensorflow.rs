//! Unmodified TensorFlow 2.21 (`tensorflow-cpu` from PyPI, in a venv the tests make; they skip,
//! saying why, where it cannot be had) on the ensemble: `MultiWorkerMirroredStrategy` workers
//! whose `TF_CONFIG` lists a replica as `ps:0`, which MWMS makes its coordination service leader.

use std::time::Duration;

use coord_tests::cluster::free_ports;
use coord_tests::jax::{Jax, Sidecar, JAX_0_10};
use coord_tests::jax_failover::{jax_namespace_flags, FailoverJob};
use coord_tests::tf::{wall, Tf, Worker, WorkerSpec};
use coord_tests::torch::{StoreSidecar, Torch};
use coord_tests::torchrun::{finished, torchrun_args, Launched};
use coord_tests::{Cluster, ClusterOptions};

/// TF's import alone takes seconds on two loaded cores; a worker's whole life fits in this.
const WORKER_PATIENCE: Duration = Duration::from_secs(240);

fn tf_or_skip(test: &str) -> Option<Tf> {
    match Tf::get() {
        Ok(t) => Some(t),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

/// The ensemble as MWMS's own service is configured: job `worker` of `n`, heartbeat timeout
/// 10 s (TF's default: its agents heartbeat every 5 s).
fn ensemble(n: usize) -> Cluster {
    Cluster::start(ClusterOptions {
        extra_args: vec!["--job".into(), format!("worker={n}")],
        ..ClusterOptions::default()
    })
}

/// Addresses for the `n` workers' own servers (MWMS's collectives go worker to worker).
fn worker_addresses(n: usize) -> Vec<String> {
    free_ports(n)
        .into_iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect()
}

/// Starts the `n` workers of a job pointed at `coordinator`.
fn start_job(
    tf: &Tf,
    n: usize,
    coordinator: &str,
    steps: u32,
    sleep: Duration,
    run: &str,
) -> Vec<Worker> {
    let workers = worker_addresses(n);
    (0..n)
        .map(|index| {
            tf.worker(&WorkerSpec {
                workers: workers.clone(),
                index,
                coordinator: coordinator.to_string(),
                steps,
                step_sleep: sleep,
                run: run.to_string(),
            })
        })
        .collect()
}

/// The last step a worker reported.
fn last_step(w: &Worker) -> u64 {
    w.events()
        .iter()
        .filter(|e| e["event"] == "step")
        .filter_map(|e| e["step"].as_u64())
        .max()
        .unwrap_or(0)
}

/// Waits until a worker reported step `n`.
async fn wait_step(w: &Worker, n: u64) {
    let deadline = tokio::time::Instant::now() + WORKER_PATIENCE;
    while last_step(w) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "worker {} stopped at step {}: {:?}",
            w.index,
            last_step(w),
            w.events().last()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every worker trains to the end: keys exchanged, barrier passed, every all-reduce right.
async fn trains_to_the_end(job: &mut [Worker], steps: u32) {
    let n = job.len();
    for w in job.iter_mut() {
        let done = w.wait_event("done", WORKER_PATIENCE).await;
        assert!(done.is_object());
        let events = w.events();
        let kv = events
            .iter()
            .find(|e| e["event"] == "kv")
            .expect("kv event");
        assert_eq!(
            kv["value"],
            format!("hello from {}", (w.index + 1) % n),
            "worker {} read its peer's key",
            w.index
        );
        let sum = (1..=n).sum::<usize>() as f64;
        let totals: Vec<f64> = events
            .iter()
            .filter(|e| e["event"] == "step")
            .filter_map(|e| e["total"].as_f64())
            .collect();
        assert_eq!(
            totals.len(),
            steps as usize,
            "worker {}: {events:?}",
            w.index
        );
        assert!(
            totals.iter().all(|t| *t == sum),
            "worker {}: {totals:?}",
            w.index
        );
        assert_eq!(w.wait_exit(Duration::from_secs(60)).await, Some(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mwms_workers_train_on_the_ensemble() {
    let Some(tf) = tf_or_skip("mwms_workers_train_on_the_ensemble") else {
        return;
    };
    let mut cluster = ensemble(2);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    // Through a follower, so that forwarding is on every call's path.
    let via = cluster.replica(cluster.other_than(leader)).grpc.to_string();
    let mut job = start_job(&tf, 2, &via, 5, Duration::ZERO, "once");
    trains_to_the_end(&mut job, 5).await;
}

/// Worker 1 of a 2-worker job, each worker pointed at its entry of `coordinators`, is killed
/// mid-training; worker 0 must fail with an error naming it. Returns how long after the kill.
async fn killed_worker_seen_after(tf: &Tf, workers: &[String], coordinators: &[String]) -> f64 {
    let mut job: Vec<Worker> = (0..2)
        .map(|index| {
            tf.worker(&WorkerSpec {
                workers: workers.to_vec(),
                index,
                coordinator: coordinators[index].clone(),
                steps: 100_000,
                step_sleep: Duration::from_millis(100),
                run: "killed".into(),
            })
        })
        .collect();
    for w in &job {
        w.wait_event("step", WORKER_PATIENCE).await;
    }
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    job[1].kill();
    let error = job[0].wait_event("error", Duration::from_secs(60)).await;
    let after = wall(&error) - killed_at;
    let message = error["message"].as_str().unwrap_or_default();
    eprintln!("worker 0 failed {after:.1} s after worker 1's kill: {message}");
    assert!(
        message.contains("/job:worker/task:1"),
        "the error names the dead task: {message}"
    );
    assert_eq!(job[0].wait_exit(Duration::from_secs(60)).await, Some(3));
    after
}

/// A worker killed mid-training: the other learns of it from the service (as the answer to its
/// next heartbeat) and fails, within the heartbeat timeout plus one heartbeat interval of the
/// kill (TensorFlow's own service pushes the error at the timeout instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_fails_the_others() {
    let Some(tf) = tf_or_skip("a_killed_worker_fails_the_others") else {
        return;
    };
    // TF's agent: heartbeat timeout 10 s, a heartbeat every 5 s, and a 1 s pause before it acts
    // on a failed heartbeat; the service looks for silent tasks every 250 ms; and 1 s for the
    // abort to reach the training step and be printed.
    const BOUND: f64 = 10.0 + 5.0 + 1.0 + 1.0;
    let mut cluster = ensemble(2);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let via = cluster.replica(leader).grpc.to_string();
    let after = killed_worker_seen_after(&tf, &worker_addresses(2), &[via.clone(), via]).await;
    assert!(
        after <= BOUND,
        "worker 0 learned of worker 1's death {after:.1} s after the kill (bound {BOUND} s)"
    );
}

/// The same, each worker behind a coord-proxy told its task and the task's address
/// (`--task`, `--push-errors-to`): the proxy pushes the error to the task as the ensemble commits
/// it, as TensorFlow's own service does, so the survivor fails within the heartbeat timeout of
/// the dead worker's last heartbeat, not a heartbeat interval later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_fails_the_others_at_once_through_pushing_proxies() {
    let Some(tf) = tf_or_skip("a_killed_worker_fails_the_others_at_once_through_pushing_proxies")
    else {
        return;
    };
    // Heartbeat timeout 10 s after the dead worker's last heartbeat (sent before the kill), the
    // service's 250 ms look, and 2 s for the push, the abort and its printing on a loaded machine.
    const BOUND: f64 = 10.0 + 0.25 + 2.0;
    let mut cluster = ensemble(2);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let endpoints = cluster.endpoints();
    let workers = worker_addresses(2);
    let proxies: Vec<Sidecar> = (0..2)
        .map(|i| {
            let extra = [
                "--task".to_string(),
                format!("worker:{i}"),
                "--push-errors-to".into(),
                workers[i].clone(),
            ];
            Sidecar::start_with(&endpoints, &extra)
        })
        .collect();
    let via: Vec<String> = proxies.iter().map(|p| p.addr.clone()).collect();
    let after = killed_worker_seen_after(&tf, &workers, &via).await;
    assert!(
        after <= BOUND,
        "worker 0 learned of worker 1's death {after:.1} s after the kill (bound {BOUND} s)"
    );
}

/// The same job three times in a row on one ensemble, with the same key names and barrier ids:
/// MWMS never calls ShutdownTask, so each run's tasks are still connected when the next starts,
/// until their heartbeats time out; the next run then begins clean (no task in ERROR, no old key,
/// no barrier instance already passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_job_runs_three_times_in_a_row() {
    let Some(tf) = tf_or_skip("the_same_job_runs_three_times_in_a_row") else {
        return;
    };
    let mut cluster = ensemble(2);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let via = cluster.replica(leader).grpc.to_string();
    for attempt in 0..3 {
        eprintln!("run {attempt}");
        let mut job = start_job(&tf, 2, &via, 3, Duration::ZERO, "same");
        trains_to_the_end(&mut job, 3).await;
    }
}

/// MWMS workers, each through its own coord-proxy sidecar, train through the kill -9 of the
/// leader and then of the next leader without an error: the proxies hold their calls (heartbeats
/// among them) and send them to whichever replica leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mwms_trains_through_two_leader_kills_behind_coord_proxy() {
    let Some(tf) = tf_or_skip("mwms_trains_through_two_leader_kills_behind_coord_proxy") else {
        return;
    };
    let mut cluster = ensemble(2);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let endpoints = cluster.endpoints();
    let proxies: Vec<Sidecar> = (0..2).map(|_| Sidecar::start(&endpoints)).collect();
    let steps = 250;
    let mut job = workers_behind(&tf, &worker_addresses(2), &proxies, steps, "failover");
    for w in &job {
        w.wait_event("step", WORKER_PATIENCE).await;
    }
    for kill in 0..2 {
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        eprintln!("kill {kill}: replica {leader}");
        cluster.kill(leader);
        cluster.wait_for_leader(Duration::from_secs(30)).await;
        // Training goes on for over a heartbeat interval (5 s, at 100 ms a step) on the new
        // leader before the next kill.
        for w in &job {
            let now = last_step(w);
            wait_step(w, now + 55).await;
        }
        cluster.spawn(leader);
    }
    trains_to_the_end(&mut job, steps).await;
}

/// The checkpoint a preempted worker reported writing: (step, total).
async fn checkpointed(w: &mut Worker) -> (u64, f64) {
    let e = w.wait_event("checkpointed", WORKER_PATIENCE).await;
    let at = (
        e["step"].as_u64().expect("step"),
        e["total"].as_f64().expect("total"),
    );
    assert_eq!(
        w.wait_exit(Duration::from_secs(60)).await,
        Some(42),
        "worker {} exits with TensorFlow's restart code after its checkpoint",
        w.index
    );
    at
}

/// "Survive chief preemption", for TensorFlow users: MWMS workers under TensorFlow's
/// `PreemptionCheckpointHandler`, each through a coord-proxy sidecar. SIGTERM to the chief: the
/// workers agree on a step through the service's keys, every one saves its checkpoint at that
/// step and exits; the job started again on the same ensemble (a new run, whose keys start
/// clean: TensorFlow's handler uses fixed key names) resumes from that step and trains to the
/// end with the all-reduced total intact. With `kill_leader`, the coordinator leader is killed
/// the moment the chief has written its checkpoint, and stays dead for the rerun.
async fn chief_preempted(test: &str, kill_leader: bool) {
    let Some(tf) = tf_or_skip(test) else {
        return;
    };
    const N: usize = 2;
    let mut cluster = ensemble(N);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let endpoints = cluster.endpoints();
    let proxies: Vec<Sidecar> = (0..N).map(|_| Sidecar::start(&endpoints)).collect();
    let dir = tempfile::tempdir().expect("checkpoint dir");
    let start = |steps: u32| -> Vec<Worker> {
        let workers = worker_addresses(N);
        (0..N)
            .map(|index| {
                let spec = WorkerSpec {
                    workers: workers.clone(),
                    index,
                    coordinator: proxies[index].addr.clone(),
                    steps,
                    step_sleep: Duration::from_millis(100),
                    run: String::new(),
                };
                tf.preemption_worker(&spec, dir.path())
            })
            .collect()
    };

    let mut job = start(1_000_000);
    for w in &job {
        wait_step(w, 5).await;
    }
    job[0].terminate();
    let (step, total) = checkpointed(&mut job[0]).await;
    if kill_leader {
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        eprintln!("the chief checkpointed at step {step}: killing leader {leader}");
        cluster.kill(leader);
    }
    for w in &mut job[1..] {
        assert_eq!(
            checkpointed(w).await,
            (step, total),
            "worker {} saved at the chief's step",
            w.index
        );
    }
    let per_step = (1..=N).sum::<usize>() as f64;
    assert_eq!(total, step as f64 * per_step, "the total of {step} steps");
    eprintln!("every worker checkpointed at step {step}; starting the job again");

    let more = 10;
    let mut job = start(step as u32 + more);
    for w in &mut job {
        let resumed = w.wait_event("resumed", WORKER_PATIENCE).await;
        assert_eq!(resumed["step"].as_u64(), Some(step), "worker {}", w.index);
        assert_eq!(resumed["total"].as_f64(), Some(total), "worker {}", w.index);
    }
    for w in &mut job {
        let done = w.wait_event("done", WORKER_PATIENCE).await;
        assert_eq!(done["step"].as_u64(), Some(step + u64::from(more)));
        assert_eq!(
            done["total"].as_f64(),
            Some(total + f64::from(more) * per_step),
            "worker {}: {:?}",
            w.index,
            w.events()
        );
        assert_eq!(w.wait_exit(Duration::from_secs(60)).await, Some(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_chief_checkpoints_and_the_job_resumes() {
    chief_preempted("preempted_chief_checkpoints_and_the_job_resumes", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_chief_with_the_leader_killed_as_it_exits() {
    chief_preempted("preempted_chief_with_the_leader_killed_as_it_exits", true).await;
}

/// The sidecars of an MWMS job of two workers in namespace `ns`, each pushing errors to its
/// worker, and the workers (`steps` steps of 100 ms).
fn mwms_job_in(tf: &Tf, endpoints: &[String], ns: &str, steps: u32) -> (Vec<Sidecar>, Vec<Worker>) {
    let workers = worker_addresses(2);
    let proxies: Vec<Sidecar> = (0..2)
        .map(|i| {
            let task = format!("worker:{i}");
            let extra: Vec<String> = [
                "--namespace",
                ns,
                "--job",
                "worker=2",
                "--task",
                task.as_str(),
                "--push-errors-to",
                workers[i].as_str(),
            ]
            .map(String::from)
            .to_vec();
            Sidecar::start_with(endpoints, &extra)
        })
        .collect();
    let job = workers_behind(tf, &workers, &proxies, steps, "same");
    (proxies, job)
}

/// The workers at `workers`, each through its own sidecar of `proxies`, `steps` steps of 100 ms.
fn workers_behind(
    tf: &Tf,
    workers: &[String],
    proxies: &[Sidecar],
    steps: u32,
    run: &str,
) -> Vec<Worker> {
    proxies
        .iter()
        .enumerate()
        .map(|(index, proxy)| {
            tf.worker(&WorkerSpec {
                workers: workers.to_vec(),
                index,
                coordinator: proxy.addr.clone(),
                steps,
                step_sleep: Duration::from_millis(100),
                run: run.into(),
            })
        })
        .collect()
}

/// Four training jobs at once on one ensemble, each through sidecars of its own namespace: two
/// MWMS jobs with the same task names, key names and barrier ids, a JAX job (jaxlib's four
/// processes, under barriers and blocking gets) and a torchrun job. All four go on through a
/// leader kill -9, each to what it gets alone (MWMS: every all-reduce right; JAX: each increment
/// once, its own counter; torch: every step once and the weights of a run without a kill); then a
/// worker of one MWMS job is killed, and only that job fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_jobs_of_three_frameworks_on_one_ensemble_fail_apart() {
    let test = "four_jobs_of_three_frameworks_on_one_ensemble_fail_apart";
    let Some(tf) = tf_or_skip(test) else {
        return;
    };
    let jax = match Jax::get(JAX_0_10) {
        Ok(j) => j,
        Err(why) => return eprintln!("SKIPPED {test}: {why}"),
    };
    let Some(torch) = Torch::or_skip(test) else {
        return;
    };
    const TORCH_STEPS: u64 = 300;
    let steps = 1200;
    let mut cluster = ensemble(2);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let endpoints = cluster.endpoints();
    let torch_sidecar = |ns: &str| StoreSidecar::start_with(&endpoints, &["--namespace", ns]);
    // torch's reference, in a namespace of its own, done before any kill.
    let calm = torch_sidecar("torch-calm");
    let mut reference = Launched::start(&torch, &torchrun_args(&calm.store, "shared", TORCH_STEPS));
    let mut jobs: Vec<_> = ["tf-a", "tf-b"]
        .iter()
        .map(|ns| mwms_job_in(&tf, &endpoints, ns, steps))
        .collect();
    let (_, expected) = finished(&mut reference);
    for (_, job) in &jobs {
        for w in job {
            w.wait_event("step", WORKER_PATIENCE).await;
        }
    }
    let jax_job = FailoverJob::start(
        &jax,
        &endpoints,
        &jax_namespace_flags("jax-c"),
        Some("jax-c"),
    );
    let torch_d = torch_sidecar("torch-d");
    let mut torch_job = Launched::start(
        &torch,
        &torchrun_args(&torch_d.store, "shared", TORCH_STEPS),
    );
    jax_job.wait_arrived(1).await;
    torch_job.wait_for("step 80 ", WORKER_PATIENCE);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    eprintln!("kill -9 leader {leader} under all four jobs");
    cluster.kill(leader);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    jax_job.go(1).await;
    for (_, job) in &jobs {
        for w in job {
            let now = last_step(w);
            wait_step(w, now + 20).await;
        }
    }
    jax_job.wait_arrived(2).await;
    jax_job.go(2).await;
    cluster.spawn(leader);
    // A worker of tf-a dies: tf-a's other worker fails, naming it; the others go on to the end.
    let (_, a) = &mut jobs[0];
    a[1].kill();
    let error = a[0].wait_event("error", Duration::from_secs(60)).await;
    let message = error["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("/job:worker/task:1"), "{message}");
    assert_eq!(a[0].wait_exit(Duration::from_secs(60)).await, Some(3));
    let (_, b) = &mut jobs[1];
    trains_to_the_end(b, steps).await;
    jax_job.finish(&[leader]).await;
    let (torch_steps, result) = finished(&mut torch_job);
    assert_eq!(
        torch_steps,
        (0..TORCH_STEPS).collect::<Vec<_>>(),
        "torch: every step once"
    );
    assert_eq!(
        result, expected,
        "torch: the weights of its run without a kill"
    );
}

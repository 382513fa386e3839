//! Preemption sync (TensorFlow's `PreemptionSyncManager`) over a replicated ensemble: the four
//! multi-process scenarios of `coord-demo`, bad input, and a second preemption in the same job.

use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use coord_agent::preemption::{
    format_death_time, ManualNotice, ManualNotifier, PreemptionEvent, PreemptionOptions,
    PreemptionSyncManager, COUNTER_DIR, NOTICE_KEY,
};
use coord_agent::{Agent, AgentConfig};
use coord_tests::cluster::workspace_binary;
use coord_tests::{Cluster, ClusterOptions};
use coord_tools::demo::{run_job, JobOptions, JobOutcome, Scenario};

/// `coord-demo`, a binary of `coord-tools` (built on first use).
fn demo() -> PathBuf {
    workspace_binary("coord-demo", None)
}

async fn job(scenario: Scenario) -> JobOutcome {
    let outcome = run_job(
        &demo(),
        JobOptions {
            scenario,
            // A task that dies before the barrier costs the others a heartbeat timeout (4 s)
            // at the barrier; the preempted task must still reach its death time before the job
            // ends.
            steps: if scenario == Scenario::Dies { 120 } else { 60 },
            grace: Duration::from_secs(if scenario == Scenario::Dies { 8 } else { 30 }),
            echo: false,
            ..JobOptions::default()
        },
    )
    .await;
    eprintln!("{}", outcome.lines.join("\n"));
    outcome
}

/// Every task agreed on one sync step and checkpointed there; returns it.
fn one_sync_step(o: &JobOutcome, tasks: &[i32]) -> i64 {
    let mut agreed = Vec::new();
    for t in tasks {
        let who = format!("worker/{t}");
        let steps = o.steps(&who, "sync point agreed: step");
        assert_eq!(steps.len(), 1, "{who} agreed once: {steps:?}");
        let ckpt = o.steps(&who, "checkpoint at step");
        assert_eq!(ckpt, steps, "{who} checkpointed at the sync step");
        agreed.push(steps[0]);
    }
    agreed.dedup();
    assert_eq!(agreed.len(), 1, "all tasks agreed on one step: {agreed:?}");
    agreed[0]
}

/// `tasks` were preempted at `step`, came back and resumed there; everyone finished.
fn resumed(o: &JobOutcome, preempted: &[i32], step: i64) {
    for t in preempted {
        let who = format!("worker/{t}");
        assert_eq!(
            o.steps(&who, "exiting for preemption after step"),
            vec![step]
        );
        assert_eq!(
            o.steps(&who, "restored checkpoint of step"),
            vec![step],
            "{who} restarted from the checkpoint"
        );
    }
    for t in 0..3 {
        let who = format!("worker/{t}");
        assert_eq!(
            o.steps(&who, "resumed together after step"),
            vec![step],
            "{who} resumed"
        );
        assert_eq!(
            o.said(&who, "done at step 60").len(),
            1,
            "{who} finished the job"
        );
    }
    assert!(
        o.exits.iter().all(|(_, code)| *code == Some(0)),
        "every task process exited cleanly: {:?}",
        o.exits
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chief_preempted_while_the_leader_dies() {
    let o = job(Scenario::Chief).await;
    let step = one_sync_step(&o, &[0, 1, 2]);
    assert_eq!(
        o.said("coord-demo", "the leader, on the chief's host")
            .len(),
        1
    );
    resumed(&o, &[0], step);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notice_during_an_election() {
    let o = job(Scenario::Election).await;
    assert_eq!(o.said("coord-demo", "an election begins").len(), 1);
    let step = one_sync_step(&o, &[0, 1, 2]);
    resumed(&o, &[1], step);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_preempted_at_once() {
    let o = job(Scenario::Two).await;
    let step = one_sync_step(&o, &[0, 1, 2]);
    resumed(&o, &[1, 2], step);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_dead_before_the_barrier_fails_it_cleanly() {
    let o = job(Scenario::Dies).await;
    for t in [0, 1] {
        let who = format!("worker/{t}");
        let failed = o.said(&who, "sync failed (round 0)");
        assert_eq!(failed.len(), 1, "{who} was told the sync failed");
        assert!(
            failed[0].contains("task:2"),
            "the reason names the dead task: {}",
            failed[0]
        );
        assert!(
            o.said(&who, "checkpoint at step").is_empty(),
            "no sync point, no checkpoint"
        );
    }
    // Nobody hangs: the preempted task dies at its death time, the other one finishes.
    assert_eq!(o.said("worker/1", "before any sync point").len(), 1);
    assert_eq!(o.said("worker/0", "done at step 120").len(), 1);
    let code = |t: i32| o.exits.iter().find(|(id, _)| *id == t).map(|(_, c)| *c);
    assert_eq!(code(0), Some(Some(0)));
    assert_eq!(code(1), Some(Some(3)));
}

/// In-process agents of a 3-task job on a real ensemble; the first tasks each with a manager and
/// its events.
struct Job {
    _cluster: Cluster,
    agents: Vec<Agent>,
    managers: Vec<PreemptionSyncManager>,
    notices: Vec<ManualNotice>,
    events: Vec<Arc<Mutex<Vec<PreemptionEvent>>>>,
    /// The job's step counter (every task steps together).
    step: AtomicI64,
}

async fn in_process_job() -> Job {
    in_process_job_with(PreemptionOptions::default(), 3).await
}

/// A job whose first `managed` tasks run a manager with `options`; the others are connected but
/// have not started theirs, so the sync barrier waits for them.
async fn in_process_job_with(options: PreemptionOptions, managed: i32) -> Job {
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: ["--job", "worker=3", "--recoverable-job", "worker"]
            .map(String::from)
            .to_vec(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let mut job = Job {
        agents: Vec::new(),
        managers: Vec::new(),
        notices: Vec::new(),
        events: Vec::new(),
        step: AtomicI64::new(0),
        _cluster: cluster,
    };
    for t in 0..3 {
        let agent = Agent::new(
            AgentConfig::new(job._cluster.endpoints(), "worker", t),
            |_| {},
        )
        .expect("agent");
        agent.connect().await.expect("connect");
        if t >= managed {
            job.agents.push(agent);
            continue;
        }
        let (notifier, notice) = ManualNotifier::new();
        let events: Arc<Mutex<Vec<PreemptionEvent>>> = Arc::default();
        let sink = events.clone();
        let m = PreemptionSyncManager::start(
            agent.clone(),
            Box::new(notifier),
            options.clone(),
            move |e| sink.lock().expect("events").push(e),
        );
        job.agents.push(agent);
        job.managers.push(m);
        job.notices.push(notice);
        job.events.push(events);
    }
    job
}

impl Job {
    /// Steps every task until each saw an event matching `f`; returns those events.
    async fn step_until(
        &self,
        mut f: impl FnMut(&PreemptionEvent) -> bool,
    ) -> Vec<PreemptionEvent> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let step = self.step.fetch_add(1, Ordering::SeqCst) + 1;
            for m in &self.managers {
                m.reached_sync_point(step).await;
            }
            let found: Vec<Option<PreemptionEvent>> = self
                .events
                .iter()
                .map(|e| e.lock().expect("events").iter().find(|x| f(x)).cloned())
                .collect();
            if found.iter().all(Option::is_some) {
                return found.into_iter().flatten().collect();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "events so far: {:?}",
                self.events
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unparsable_death_time_fails_the_round_for_everyone() {
    let job = in_process_job().await;
    job.agents[0]
        .insert_key_value(NOTICE_KEY, "next tuesday")
        .await
        .expect("insert");
    let failed = job
        .step_until(|e| matches!(e, PreemptionEvent::Failed { round: 0, .. }))
        .await;
    for f in failed {
        let PreemptionEvent::Failed { reason, .. } = f else {
            unreachable!()
        };
        assert!(
            reason.contains("next tuesday"),
            "the reason names the bad value: {reason}"
        );
    }
    // Training goes on, and the next notice starts a fresh round that succeeds.
    job.notices[2].notify(SystemTime::now() + Duration::from_secs(60));
    let agreed = job
        .step_until(|e| matches!(e, PreemptionEvent::SyncPoint { round: 1, .. }))
        .await;
    assert_eq!(agreed.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_that_is_not_a_number_fails_the_round_for_everyone() {
    let job = in_process_job().await;
    job.agents[0]
        .insert_key_value(&format!("{COUNTER_DIR}/job:worker/task:99"), "many")
        .await
        .expect("insert");
    job.notices[1].notify(SystemTime::now() + Duration::from_secs(60));
    let failed = job
        .step_until(|e| matches!(e, PreemptionEvent::Failed { round: 0, .. }))
        .await;
    for f in failed {
        let PreemptionEvent::Failed { reason, .. } = f else {
            unreachable!()
        };
        assert!(reason.contains("many"), "{reason}");
    }
}

/// The service outlives the tasks, so the protocol runs again for the next preemption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_preemption_runs_a_second_round() {
    let job = in_process_job().await;
    job.notices[0].notify(SystemTime::now() + Duration::from_secs(60));
    let first = job
        .step_until(|e| matches!(e, PreemptionEvent::SyncPoint { round: 0, .. }))
        .await;
    let step_of = |e: &PreemptionEvent| match e {
        PreemptionEvent::SyncPoint { step, .. } => *step,
        _ => unreachable!(),
    };
    let s0 = step_of(&first[0]);
    assert!(
        first.iter().all(|e| step_of(e) == s0),
        "one sync point: {first:?}"
    );
    // The round is cleared before the next notice can be published.
    let cleared = tokio::time::Instant::now() + Duration::from_secs(30);
    while job.agents[0]
        .try_get_key_value(NOTICE_KEY)
        .await
        .expect("read")
        .is_some()
    {
        assert!(
            tokio::time::Instant::now() < cleared,
            "round 0 was never cleared"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let death = SystemTime::now() + Duration::from_secs(90);
    job.notices[2].notify(death);
    let second = job
        .step_until(|e| matches!(e, PreemptionEvent::SyncPoint { round: 1, .. }))
        .await;
    let s1 = step_of(&second[0]);
    assert!(
        second.iter().all(|e| step_of(e) == s1),
        "one sync point: {second:?}"
    );
    assert!(s1 > s0);
    let seen = job
        .step_until(|e| matches!(e, PreemptionEvent::NoticeReceived { round: 1, .. }))
        .await;
    assert!(seen.iter().all(|e| matches!(e, PreemptionEvent::NoticeReceived { death_time, .. } if *death_time == format_death_time(death))));
}

/// A task whose manager is dropped mid-round will never arrive at the sync barrier: the others'
/// round fails at once (CANCELLED), not after the barrier's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_manager_mid_round_fails_the_round_for_the_others_at_once() {
    let barrier_timeout = Duration::from_secs(60);
    // Task 2 starts no manager: the barrier cannot pass before task 1's manager is dropped.
    let mut job = in_process_job_with(
        PreemptionOptions {
            barrier_timeout,
            ..PreemptionOptions::default()
        },
        2,
    )
    .await;
    job.notices[0].notify(SystemTime::now() + Duration::from_secs(60));
    // A task publishes its counter just before it joins the barrier.
    let joining = tokio::time::Instant::now() + Duration::from_secs(30);
    for t in [0, 1] {
        let key = format!("{COUNTER_DIR}/job:worker/task:{t}");
        while job.agents[0]
            .try_get_key_value(&key)
            .await
            .expect("read")
            .is_none()
        {
            assert!(
                tokio::time::Instant::now() < joining,
                "task {t} never reached the barrier: {:?}",
                job.events
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let dropped = job.managers.remove(1);
    job.events.remove(1);
    job.notices.remove(1);
    let since = tokio::time::Instant::now();
    drop(dropped);
    let failed = job
        .step_until(|e| matches!(e, PreemptionEvent::Failed { round: 0, .. }))
        .await;
    assert!(
        since.elapsed() < Duration::from_secs(20),
        "the round failed only after {:?} (barrier timeout {barrier_timeout:?})",
        since.elapsed()
    );
    let [PreemptionEvent::Failed { reason, .. }] = failed.as_slice() else {
        panic!("one failure, of task 0: {failed:?}")
    };
    assert!(
        reason.contains("cancelled") && reason.contains("task:1"),
        "cancelled by the dropped task: {reason}"
    );
}

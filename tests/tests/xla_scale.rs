//! A JAX job of 2,000 tasks on jaxlib's wire registers and asks GetAliveTasks in a log of a few
//! bytes a call, through a follower that relays the round's one answer; every task watches the
//! job's tasks while two leave; then most of its tasks leave while the rest wait to learn who is
//! alive. A binary of its own: beside `scale.rs`'s 20,000-task job, on two cores, the two
//! jobs starved each other's Raft heartbeats.

use coord_tests::bench::xla_scale;

/// A JAX job on jaxlib's wire, calling a follower: its registration storm (every task waits at
/// the register barrier of the whole job) and a GetAliveTasks round of every task about every
/// task commit a few bytes a call, and the follower relays the round's one answer to every task,
/// compressed once. Each call used to commit the job's task list, N² bytes of log in all: about 26 KB a
/// call at 2,000 tasks, and leaders lost their lease under the storm's 5 MB entries. Every task
/// watches the job's tasks (WatchTasks) while one leaves, and the follower relays the leader's
/// one answer to all of them, compressed once; then again through sidecars. Then all
/// but 100 tasks leave while those 100 wait in a GetAliveTasks round, which answers them with
/// themselves alone (a walk of the job per leaver once cost the leader its term here). Only
/// log bytes and answers are asserted, never time (the times are `coord-bench xla-scale`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jax_jobs_registration_and_alive_round_write_a_few_bytes_a_call() {
    const TASKS: usize = 2_000;
    let args = xla_scale::Args {
        sizes: vec![TASKS],
        tasks_per_connection: 100,
        heartbeat_ms: 10_000,
        no_gzip: false,
        own_alive_max: TASKS,
        cpu_window_ms: 1_000,
        // Through a follower, which relays every call to the leader.
        via_follower: true,
        // Last, all but 100 tasks leave while those 100 wait in a GetAliveTasks round, which
        // must answer them with themselves alone once the last has left (the phase checks it).
        // Then every task watches the job's tasks while one leaves, by its own call and through
        // the sidecars.
        watchers: true,
        watch_max: TASKS,
        stayers: 100,
        // Before they leave, 200 barrier ids pass, each one task's (a job's history).
        history_barriers: 200,
        // A leader change fails the run, and a debug build under the storm on a loaded CI
        // machine can miss the 300 ms lease: timeouts as an operator of a loaded machine sets
        // them (what is asserted is the log, not failover).
        coord_args: [
            "--heartbeat-ms=200",
            "--election-timeout-min-ms=1500",
            "--election-timeout-max-ms=3000",
        ]
        .map(String::from)
        .to_vec(),
    };
    let m = xla_scale::measure(&args, TASKS)
        .await
        .expect("the job registered and asked who is alive");
    let own = m.own_alive.as_ref().expect("the round of own calls");
    let leaving = m.leaving.as_ref().expect("the phase of tasks leaving");
    assert_eq!(
        (leaving.leavers, leaving.stayers, leaving.history_barriers),
        (TASKS - 100, 100, 200)
    );
    assert_eq!(own.alive_listed, TASKS, "every task alive");
    // Every watcher got the job's records of the new version (the phase checks the answers
    // through the sidecars), and the follower relaying the own calls compressed that answer
    // once for all 2,000 of them (the leader encoded it once: the follower's copies are the
    // leader's bytes, kept by those bytes).
    let watching = m.watching.as_ref().expect("the phase of watchers");
    assert_eq!(watching.watchers, TASKS);
    assert_eq!(
        watching.own.compressions,
        Some(1),
        "answers the follower compressed for {TASKS} watchers of one version"
    );
    // The follower got the leader's one answer for each of its callers, and compressed it once
    // for all of them (each caller accepts gzip, as jaxlib does).
    assert_eq!(
        own.called_compressions, 1,
        "answers the follower compressed over the round"
    );
    // The follower recorded each call's ask on the leader and waited on the round there for all
    // of its callers at once, rather than parking each call on the leader and getting a copy of
    // the answer for each (2,000 copies). A caller whose ask finished the round may look after
    // every other caller of the round had its answer and the shared wait was gone: then a second
    // wait, answered at once.
    assert!(
        (1..=2).contains(&own.called_round_waits),
        "the follower waited on the round on the leader {} times for its {TASKS} callers",
        own.called_round_waits
    );
    // Each caller's ask was recorded on the leader, the asks that came while one call recording
    // them was on its way together in the next, the set listed once a call (not once an ask:
    // 2,000 lists of 2,000 tasks).
    eprintln!(
        "the follower recorded {} asks in {} calls",
        own.called_asks, own.called_ask_calls
    );
    assert!(
        own.called_asks >= TASKS as u64,
        "the follower recorded {} asks for its {TASKS} callers",
        own.called_asks
    );
    assert!(
        own.called_ask_calls * 4 <= own.called_asks,
        "the follower recorded {} asks in {} calls",
        own.called_asks,
        own.called_ask_calls
    );
    // A call's entry is its task and the set's one run, with the command's framing: well
    // under 1 KB (the list was 13 bytes a task: 26 KB).
    for (phase, log) in [
        ("RegisterTask", m.register_log),
        ("GetAliveTasks", own.alive_log),
    ] {
        assert!(
            log.records < (TASKS * 1_024) as i64,
            "{phase}: {} bytes of log records for {TASKS} calls",
            log.records
        );
    }
}

//! The rendezvous over direct worker links, with real `link-worker` processes and a real ensemble
//! (used only to publish and look up link addresses, and to receive error reports).

use std::time::Duration;

use coord_proto::tensorflow as tf;
use coord_tests::cluster::{send_signal, Cluster, ClusterOptions};
use coord_tests::link::{LinkWorker, WATCH_PAIR};

const TIMEOUT: Duration = Duration::from_secs(120);

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A producer (task 1) and a consumer (task 2) of `steps` steps of one `bytes`-byte tensor.
fn pair(c: &Cluster, steps: i64, bytes: usize, extra: &[&str]) -> (LinkWorker, LinkWorker) {
    let common = |role: &str, partner: &str| {
        let mut a = args(&[
            "--role",
            role,
            "--partner",
            partner,
            "--steps",
            &steps.to_string(),
            "--bytes",
            &bytes.to_string(),
        ]);
        a.extend(args(extra));
        a
    };
    let p = common("produce", "2");
    let q = common("consume", "1");
    let producer = LinkWorker::start(&c.endpoints(), 1, &strs(&p));
    let consumer = LinkWorker::start(&c.endpoints(), 2, &strs(&q));
    (producer, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_steps_cross_processes_and_memory_stays_flat() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let (producer, consumer) = pair(&c, 10_000, 4096, &[]);
    let done = tokio::task::spawn_blocking(move || (consumer.done(TIMEOUT), consumer))
        .await
        .expect("join");
    let (stats, consumer) = done;
    assert_eq!(stats["tensors"], 10_000, "{stats}");
    assert_eq!(stats["live_steps"], 0, "cleanup left steps behind: {stats}");
    let early = stats["rss_bytes_at_10pct"].as_u64().expect("rss");
    let end = stats["rss_bytes"].as_u64().expect("rss");
    // 9,000 steps after the first measurement: leaking even 2 KiB a step would show.
    assert!(
        end < early + (16 << 20),
        "the consumer grew from {early} to {end} bytes over 9,000 steps"
    );
    let p = producer.done(TIMEOUT);
    assert_eq!(p["live_steps"], 0, "the producer kept steps: {p}");
    assert!(consumer.lines_with("RECV_ERROR").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_gib_tensor_crosses_intact() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    let (_producer, consumer) = pair(&c, 1, 1 << 30, &[]);
    let stats = tokio::task::spawn_blocking(move || consumer.done(Duration::from_secs(300)))
        .await
        .expect("join");
    // The consumer compared every byte before printing DONE.
    assert_eq!(stats["tensors"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_killed_mid_transfer_fails_the_receive_promptly() {
    let mut c = Cluster::start(ClusterOptions::default());
    c.wait_for_leader(TIMEOUT).await;
    // 64 MiB tensors, so that the kill lands inside a transfer.
    let (mut producer, consumer) = pair(&c, 1_000, 64 << 20, &WATCH_PAIR);
    let (consumer, killed, line) = tokio::task::spawn_blocking(move || {
        consumer
            .wait_line("STEP 2", TIMEOUT)
            .expect("the consumer never received two steps");
        let killed = producer.kill();
        let line = consumer.wait_line("RECV_ERROR", Duration::from_secs(30));
        (consumer, killed, line)
    })
    .await
    .expect("join");
    let (at, line) = line.expect("the receive did not fail after the producer died");
    let after = at.duration_since(killed);
    assert!(
        after < Duration::from_millis(2500),
        "the receive failed {after:?} after the producer died: {line}"
    );
    assert!(
        line.contains("/job:worker/replica:0/task:1"),
        "the error does not name the producer: {line}"
    );
    let mut consumer = consumer;
    assert_eq!(consumer.wait_exit(Duration::from_secs(30)), Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_declared_dead_and_reported_to_the_service() {
    let mut c = Cluster::start(ClusterOptions {
        extra_args: args(&["--job", "worker=3"]),
        ..ClusterOptions::default()
    });
    c.wait_for_leader(TIMEOUT).await;
    // No --watch: each watches every task of its job, as the service's configuration lists them.
    let watcher_args = [
        "--agent",
        "--heartbeat-ms",
        "1000",
        "--peer-timeout-ms",
        "1500",
    ];
    let watcher = LinkWorker::start(&c.endpoints(), 1, &watcher_args);
    let silent = LinkWorker::start(&c.endpoints(), 2, &watcher_args);
    let (watcher, silent, stopped, dead) = tokio::task::spawn_blocking(move || {
        watcher.wait_line("LINK", TIMEOUT).expect("watcher up");
        let (_, watching) = watcher.wait_line("WATCHING", TIMEOUT).expect("watch list");
        assert_eq!(watching, "WATCHING 3", "the job has 3 tasks");
        silent.wait_line("LINK", TIMEOUT).expect("peer up");
        watcher
            .wait_line("PEER_UP /job:worker/replica:0/task:2", TIMEOUT)
            .expect("the watcher never heard from its peer");
        let stopped = std::time::Instant::now();
        // SIGSTOP: the peer's sockets stay open but it answers nothing (a hung process).
        send_signal(i64::from(silent.pid()), "STOP");
        let dead = watcher.wait_line("PEER_DEAD", Duration::from_secs(20));
        (watcher, silent, stopped, dead)
    })
    .await
    .expect("join");
    let (at, line) = dead.expect("the silent peer was never declared dead");
    let after = at.duration_since(stopped);
    assert!(
        after <= Duration::from_millis(2500),
        "detected {after:?} after the peer went silent (1 s interval, 1.5 s timeout): {line}"
    );
    assert!(line.contains("/job:worker/replica:0/task:2"), "{line}");
    send_signal(i64::from(silent.pid()), "CONT");
    drop(silent);

    // The watcher reported the error to the coordination service.
    let client = coord_agent::CoordClient::new(coord_agent::ClientOptions::new(c.endpoints()))
        .expect("client");
    let task = tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: 1,
        recoverable: false,
    };
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let states = client
            .task_states(std::slice::from_ref(&task))
            .await
            .expect("states");
        let t = &states.tasks[0];
        if t.error_code != 0 {
            assert!(t.error_message.contains("task:2"), "{}", t.error_message);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no error reported: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(watcher);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_coordinator_leader_stalls_no_transfer_and_kills_no_peer() {
    let mut c = Cluster::start(ClusterOptions::default());
    let leader = c.wait_for_leader(TIMEOUT).await;
    let (producer, consumer) = pair(
        &c,
        20_000,
        4096,
        &[
            "--watch",
            "1,2",
            "--heartbeat-ms",
            "200",
            "--peer-timeout-ms",
            "600",
        ],
    );
    let consumer = tokio::task::spawn_blocking(move || {
        consumer
            .wait_line("STEP 2000", TIMEOUT)
            .expect("transfers under way");
        consumer
    })
    .await
    .expect("join");
    let killed = std::time::Instant::now();
    c.kill(leader);
    c.wait_for_leader(TIMEOUT).await;
    let (stats, consumer) = tokio::task::spawn_blocking(move || (consumer.done(TIMEOUT), consumer))
        .await
        .expect("join");
    assert_eq!(stats["tensors"], 20_000, "{stats}");
    // An election takes hundreds of milliseconds; no receive waited anywhere near that.
    let max_us = stats["max_us"].as_f64().expect("max");
    assert!(max_us < 250_000.0, "a receive stalled {max_us} µs: {stats}");
    // The transfer may end before the new leader is found, and the consumer then exits: its
    // producer rightly declares it dead 600 ms later. Only a death declared while both still ran
    // would be wrong.
    let (done, _) = consumer.wait_line("DONE ", TIMEOUT).expect("done");
    assert!(
        done > killed,
        "the transfer ended before the leader was killed"
    );
    for w in [&producer, &consumer] {
        let early: Vec<_> = w
            .lines()
            .into_iter()
            .filter(|(at, l)| l.starts_with("PEER_DEAD") && *at < done)
            .collect();
        assert!(
            early.is_empty(),
            "task {} declared a peer dead during the transfer: {:?}",
            w.task_id,
            w.lines()
        );
    }
}

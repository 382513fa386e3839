//! The XLA surface with the real client: jaxlib from PyPI, in venvs the tests make (they skip,
//! saying why, where PyPI or the CPython a release needs is out of reach). Every test runs once
//! per release, as `<test>::jax_0_10` (jaxlib 0.10.2, CPython 3.11) and `<test>::jax_0_12`
//! (0.12.0.1, CPython 3.12 or later).
//!
//! - The same script of every client operation runs against jaxlib's own service and against a
//!   3-replica ensemble, straight to a follower and through a coord-proxy sidecar (which records
//!   the tasks' barrier arrivals together): the outputs must be identical, error codes included.
//! - Four JAX processes behind coord-proxy sidecars live through two leader kills, one while
//!   they wait at a barrier and at a blocking get, without an error.
//! - `jax.distributed.initialize` through sidecars, with and without TLS to the ensemble; and
//!   with jaxlib's own mTLS straight to a replica ([`mtls`], 0.12 only).

use std::time::Duration;

use coord_tests::cluster::free_ports;
use coord_tests::jax::{Jax, JaxRelease, Sidecar};
use coord_tests::jax_failover::{entry, jax_namespace_flags, parse, FailoverJob, FAILOVER_TASKS};
use coord_tests::{Cluster, ClusterOptions};

// JAX's own mTLS to the replicas, with no sidecar.
#[path = "jax/mtls.rs"]
mod mtls;

/// One test per jaxlib release: `$name::jax_0_10` and `$name::jax_0_12` run `$name(release)`.
macro_rules! per_release {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn jax_0_10() {
                super::$name(coord_tests::jax::JAX_0_10).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn jax_0_12() {
                super::$name(coord_tests::jax::JAX_0_12).await
            }
        }
    )*};
}

per_release!(
    jaxlib_gets_the_answers_of_its_own_service,
    a_task_that_stops_heartbeating_is_seen_dead,
    jax_processes_survive_leader_kills_through_sidecars,
    jax_distributed_initialize_runs_on_the_ensemble,
    jax_over_tls_with_a_certificate_per_task,
);

/// The venv of `release`, or `None` after printing why the test skips.
fn jax_or_skip(test: &str, release: JaxRelease) -> Option<Jax> {
    match Jax::get(release) {
        Ok(j) => Some(j),
        Err(why) => {
            eprintln!("SKIPPED {test} (jaxlib {}): {why}", release.version);
            None
        }
    }
}

/// An ensemble serving job `jax` of `n` tasks to XLA clients, with the timeouts the scripts use.
fn ensemble(n: usize, extra: &[&str]) -> Cluster {
    let mut args: Vec<String> = [
        "--job".to_string(),
        format!("jax={n}"),
        "--shutdown-barrier-timeout-ms".into(),
        "60000".into(),
    ]
    .into();
    args.extend(extra.iter().map(|s| s.to_string()));
    Cluster::start(ClusterOptions {
        extra_args: args,
        ..ClusterOptions::default()
    })
}

/// Runs the conformance script against jaxlib's own service and against the ensemble (through
/// a follower, so that forwarding is on the path); returns both outputs.
async fn both_services(
    jax: &Jax,
    extra_script: &[&str],
    extra_server: &[&str],
) -> (String, String) {
    let port = free_ports(1)[0];
    let mut args = vec![
        format!("127.0.0.1:{port}"),
        "3".into(),
        "--own-service".into(),
    ];
    args.extend(extra_script.iter().map(|s| s.to_string()));
    let (code, theirs) = jax.run("xla_conformance.py", &args, Duration::from_secs(300));
    assert_eq!(code, Some(0), "against jaxlib's own service:\n{theirs}");

    let mut cluster = ensemble(3, extra_server);
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let follower = cluster.replica(cluster.other_than(leader)).grpc;
    let mut args = vec![follower.to_string(), "3".into()];
    args.extend(extra_script.iter().map(|s| s.to_string()));
    let (code, ours) = jax.run("xla_conformance.py", &args, Duration::from_secs(300));
    assert_eq!(code, Some(0), "against the ensemble:\n{ours}");
    (theirs, ours)
}

async fn jaxlib_gets_the_answers_of_its_own_service(release: JaxRelease) {
    let Some(jax) = jax_or_skip("jaxlib_gets_the_answers_of_its_own_service", release) else {
        return;
    };
    let (theirs, ours) = both_services(&jax, &[], &["--heartbeat-timeout-ms", "3000"]).await;
    let t = parse(&theirs);
    // The script is what it claims to be: every task ran every step, and the reference answered
    // as the wire reference describes.
    assert_eq!(t.len(), 3 * 20, "{theirs}");
    assert_eq!(entry(&t, 1, "set_again")["err"], "ALREADY_EXISTS");
    assert_eq!(entry(&t, 2, "try_get_missing")["err"], "NOT_FOUND");
    assert_eq!(
        entry(&t, 0, "blocking_get_timeout")["err"],
        "DEADLINE_EXCEEDED"
    );
    assert_eq!(
        entry(&t, 1, "barrier_not_member")["err"],
        "INVALID_ARGUMENT"
    );
    assert_eq!(entry(&t, 0, "counter_after_barrier")["ok"], "3");
    same_lines(&theirs, &ours);

    // Through a sidecar, which records the tasks' barrier arrivals and GetAliveTasks asks together
    // and waits on each instance or round once for all of them: the same answers, and no task's
    // Barrier or GetAliveTasks call went on its own.
    let mut cluster = ensemble(3, &["--heartbeat-timeout-ms", "3000"]);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = Sidecar::start(&cluster.endpoints());
    let (code, proxied) = jax.run(
        "xla_conformance.py",
        &[sidecar.addr.clone(), "3".into()],
        Duration::from_secs(300),
    );
    assert_eq!(code, Some(0), "through a sidecar:\n{proxied}");
    same_lines(&theirs, &proxied);
    let recorded = ok_calls(&cluster, "coordination/XlaBarrierArrivals");
    assert!(recorded > 0, "no barrier arrivals recorded together");
    assert_eq!(
        ok_calls(&cluster, "xla/Barrier"),
        0,
        "a task's own Barrier call"
    );
    let asked = ok_calls(&cluster, "coordination/XlaAliveAsks");
    let awaited = ok_calls(&cluster, "coordination/AwaitAlive");
    assert!(asked > 0 && awaited > 0, "asks {asked}, waits {awaited}");
    assert_eq!(
        ok_calls(&cluster, "xla/GetAliveTasks"),
        0,
        "a task's own GetAliveTasks call"
    );
}

/// Asserts that the two runs' outputs are the same, line by line.
fn same_lines(theirs: &str, ours: &str) {
    let (t, o) = (parse(theirs), parse(ours));
    for (i, (a, b)) in t.iter().zip(&o).enumerate() {
        assert_eq!(
            a, b,
            "line {i} differs\njaxlib's service:\n{theirs}\nensemble:\n{ours}"
        );
    }
    assert_eq!(
        t.len(),
        o.len(),
        "jaxlib's service:\n{theirs}\nensemble:\n{ours}"
    );
}

async fn a_task_that_stops_heartbeating_is_seen_dead(release: JaxRelease) {
    let Some(jax) = jax_or_skip("a_task_that_stops_heartbeating_is_seen_dead", release) else {
        return;
    };
    // Task 2 vanishes; its job is recoverable on both services, so the others live on and ask
    // who is alive.
    let (theirs, ours) = both_services(
        &jax,
        &["--die", "2"],
        &["--heartbeat-timeout-ms", "3000", "--recoverable-job", "jax"],
    )
    .await;
    let (t, o) = (parse(&theirs), parse(&ours));
    for task in [0, 1] {
        assert_eq!(
            entry(&t, task, "live_after_death")["ok"],
            serde_json::json!([0, 1]),
            "{theirs}"
        );
    }
    assert_eq!(t, o, "jaxlib's service:\n{theirs}\nensemble:\n{ours}");
}

async fn jax_processes_survive_leader_kills_through_sidecars(release: JaxRelease) {
    let Some(jax) = jax_or_skip(
        "jax_processes_survive_leader_kills_through_sidecars",
        release,
    ) else {
        return;
    };
    let mut cluster = ensemble(FAILOVER_TASKS, &["--heartbeat-timeout-ms", "20000"]);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let job = FailoverJob::start(&jax, &cluster.endpoints(), &[], None);
    let mut killed = Vec::new();
    for phase in 1..=2 {
        job.wait_arrived(phase).await;
        // Give the barrier calls time to reach the leader and park there (if one has not, it
        // arrives during the failover instead: a harder case, not an easier one).
        tokio::time::sleep(Duration::from_millis(500)).await;
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        eprintln!("phase {phase}: kill -9 leader {leader} under a barrier and a blocking get");
        cluster.kill(leader);
        killed.push(leader);
        let new_leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        eprintln!("phase {phase}: replica {new_leader} leads");
        job.go(phase).await;
        if phase == 1 {
            // Back to three replicas before the next kill.
            cluster.spawn(leader);
            let applied = cluster.status(new_leader).map_or(0, |s| s.last_applied);
            cluster
                .wait_applied(leader, applied, Duration::from_secs(60))
                .await;
        }
    }
    job.finish(&killed).await;
}

async fn jax_distributed_initialize_runs_on_the_ensemble(release: JaxRelease) {
    let Some(jax) = jax_or_skip("jax_distributed_initialize_runs_on_the_ensemble", release) else {
        return;
    };
    const N: u64 = 2;
    let mut cluster = ensemble(N as usize, &[]);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = Sidecar::start(&cluster.endpoints());
    initialize_job(&jax, std::slice::from_ref(&sidecar.addr), N);
}

/// Runs `jax.distributed.initialize` in `n` processes (process i through `addrs[i]`, or all
/// through the one address) and checks that each saw the whole job and exited cleanly.
fn initialize_job(jax: &Jax, addrs: &[String], n: u64) {
    let (code, out) = jax.run(
        "jax_initialize.py",
        &[addrs.join(","), n.to_string()],
        Duration::from_secs(300),
    );
    eprintln!("{out}");
    assert_eq!(code, Some(0), "{out}");
    let log = parse(&out);
    for task in 0..n {
        let seen = log
            .iter()
            .find(|e| e["task"] == task && e.get("process_count").is_some())
            .unwrap_or_else(|| panic!("task {task} saw nothing:\n{out}"));
        assert_eq!(seen["process_index"], task, "{out}");
        assert_eq!(seen["process_count"], n, "{out}");
        // The devices of every process, exchanged through the ensemble's key-value store.
        let all: Vec<u64> = (0..n).collect();
        assert_eq!(seen["device_processes"], serde_json::json!(all), "{out}");
        let local = seen["local_devices"].as_u64().expect("a count");
        assert_eq!(seen["global_devices"], local * n, "{out}");
        let exit = log
            .iter()
            .find(|e| e["task"] == task && e.get("exit").is_some())
            .expect("exit code");
        assert_eq!(exit["exit"], 0, "{out}");
    }
}

/// `jax.distributed.initialize` through sidecars that each present their own task's certificate
/// to an ensemble that requires one: the job starts as without TLS. A sidecar holding another
/// task's certificate cannot register its process.
async fn jax_over_tls_with_a_certificate_per_task(release: JaxRelease) {
    let Some(jax) = jax_or_skip("jax_over_tls_with_a_certificate_per_task", release) else {
        return;
    };
    const N: u64 = 2;
    let mut cluster = Cluster::start(ClusterOptions {
        tls: true,
        extra_args: [
            "--job",
            "jax=2",
            "--shutdown-barrier-timeout-ms",
            "60000",
            "--tls-client-auth",
            "require",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let pki = cluster.pki();
    let sidecar_of = |task: u32| {
        let files = pki.issue(&pki.task("jax", task));
        let flags = [
            "--tls-ca".to_string(),
            pki.ca_path().display().to_string(),
            "--tls-cert".into(),
            files.cert.display().to_string(),
            "--tls-key".into(),
            files.key.display().to_string(),
        ];
        Sidecar::start_with(&cluster.endpoints(), &flags)
    };
    let sidecars: Vec<Sidecar> = (0..N as u32).map(sidecar_of).collect();
    let addrs: Vec<String> = sidecars.iter().map(|s| s.addr.clone()).collect();
    initialize_job(&jax, &addrs, N);

    // Each process behind a sidecar with the other task's certificate: both are refused at once
    // (`PERMISSION_DENIED`, and jaxlib ends a process whose registration fails), and the replicas
    // counted the refusals.
    let swapped = [sidecar_of(1), sidecar_of(0)];
    let addrs: Vec<String> = swapped.iter().map(|s| s.addr.clone()).collect();
    let (code, out) = jax.run(
        "jax_initialize.py",
        &[addrs.join(","), N.to_string()],
        Duration::from_secs(300),
    );
    assert_eq!(code, Some(0), "the script itself failed:\n{out}");
    let log = parse(&out);
    assert!(
        !log.iter().any(|e| e.get("process_count").is_some()),
        "impersonating processes started a job:\n{out}"
    );
    for task in 0..N {
        let exit = log
            .iter()
            .find(|e| e["task"] == task && e.get("exit").is_some())
            .unwrap_or_else(|| panic!("no exit line of task {task}:\n{out}"));
        assert_ne!(exit["exit"], 0, "{out}");
    }
    let denied =
        "coord_rpc_duration_seconds_count{method=\"xla/RegisterTask\",code=\"PERMISSION_DENIED\"}";
    let refusals = counted(&cluster, denied);
    assert!(refusals >= N, "{refusals} refused registrations counted");
}

/// Sample `sample` (its name and labels, as `/metrics` prints them), summed over the replicas.
fn counted(cluster: &Cluster, sample: &str) -> u64 {
    let prefix = format!("{sample} ");
    cluster
        .ids()
        .into_iter()
        .filter_map(|id| coord_tests::http::get(cluster.replica(id).http, "/metrics").ok())
        .flat_map(|(_, body)| {
            body.lines()
                .filter_map(|l| l.strip_prefix(prefix.as_str()))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// OK calls of `method` the replicas counted.
fn ok_calls(cluster: &Cluster, method: &str) -> u64 {
    counted(
        cluster,
        &format!("coord_rpc_duration_seconds_count{{method=\"{method}\",code=\"OK\"}}"),
    )
}

/// Two JAX jobs at once, each through sidecars of its own namespace, with the same job, task ids,
/// keys and barrier ids: each gets what it gets alone (each increment once, its own counter),
/// through a leader kill under both jobs' barriers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_jax_jobs_in_two_namespaces_through_leader_kills() {
    let test = "two_jax_jobs_in_two_namespaces_through_leader_kills";
    let Some(jax) = jax_or_skip(test, coord_tests::jax::JAX_0_10) else {
        return;
    };
    let mut cluster = ensemble(FAILOVER_TASKS, &["--heartbeat-timeout-ms", "20000"]);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let endpoints = cluster.endpoints();
    let jobs: Vec<FailoverJob> = ["jax-a", "jax-b"]
        .iter()
        .map(|ns| FailoverJob::start(&jax, &endpoints, &jax_namespace_flags(ns), Some(ns)))
        .collect();
    let mut killed = Vec::new();
    for phase in 1..=2 {
        for job in &jobs {
            job.wait_arrived(phase).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        eprintln!("phase {phase}: kill -9 leader {leader} under both jobs' barriers");
        cluster.kill(leader);
        killed.push(leader);
        let new_leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        for job in &jobs {
            job.go(phase).await;
        }
        if phase == 1 {
            cluster.spawn(leader);
            let applied = cluster.status(new_leader).map_or(0, |s| s.last_applied);
            cluster
                .wait_applied(leader, applied, Duration::from_secs(60))
                .await;
        }
    }
    for job in jobs {
        job.finish(&killed).await;
    }
}

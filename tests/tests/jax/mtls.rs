//! jaxlib's own mTLS (`jax.distributed.initialize(mtls_cert_file=, mtls_key_file=,
//! mtls_ca_file=, mtls_peer_uri_prefix=, verify_secure_credentials=)`, jaxlib 0.11.2 and later)
//! straight to a replica of an ensemble that requires client certificates: no sidecar holds the
//! TLS. Each task presents its own `coord-certs` task certificate and checks the replica's by
//! its identity (`coord://<ensemble>/replica/`). A task certificate registering as another task
//! is refused `PERMISSION_DENIED` and changes nothing; a client without a certificate is refused.

use std::time::{Duration, Instant};

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use coord_tests::jax::JAX_0_12;
use coord_tests::jax_failover::increments;
use coord_tests::{Cluster, ClusterOptions};
use serde_json::Value;

use super::{entry, jax_or_skip, parse};

const N: u32 = 2;

fn jax_task(index: u32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "jax".into(),
        task_id: index as i32,
        recoverable: false,
    }
}

/// The one `connect` entry of a single-client run of `jax_mtls.py`, and the process's exit code.
fn connect_result(out: &str) -> (Value, Value) {
    let log = parse(out);
    let connect = log
        .iter()
        .find(|e| e["op"] == "connect")
        .unwrap_or_else(|| panic!("no connect entry:\n{out}"))
        .clone();
    let exit = log
        .iter()
        .find_map(|e| e.get("exit").cloned())
        .unwrap_or_else(|| panic!("no exit line:\n{out}"));
    (connect, exit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jax_mtls_straight_to_a_follower() {
    let test = "jax_mtls_straight_to_a_follower";
    let Some(jax) = jax_or_skip(test, JAX_0_12) else {
        return;
    };
    let mut cluster = Cluster::start(ClusterOptions {
        tls: true,
        extra_args: [
            "--job",
            "jax=2",
            // As JAX configures its own service: its clients heartbeat every 50 s.
            "--heartbeat-timeout-ms",
            "100000",
            "--shutdown-barrier-timeout-ms",
            "60000",
            "--tls-client-auth",
            "require",
        ]
        .map(String::from)
        .to_vec(),
        ..ClusterOptions::default()
    });
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    // A follower, so that forwarding (with the follower's own replica certificate) is on the path.
    let follower = cluster.replica(cluster.other_than(leader)).grpc.to_string();
    let pki = cluster.pki();
    let ca = pki.ca_path().display().to_string();
    let prefix = pki.replica_uri_prefix();
    let pair = |task: u32| {
        let files = pki.issue(&pki.task("jax", task));
        format!("{}:{}", files.cert.display(), files.key.display())
    };
    let mut options = ClientOptions::new(cluster.endpoints());
    options.tls = Some(pki.client(Some(&pki.client_identity("ops"))));
    let operator = CoordClient::new(options).expect("operator client");

    let mut args = vec!["job".into(), follower.clone(), ca.clone(), prefix.clone()];
    args.extend((0..N).map(pair));
    let mut job = jax.spawn("jax_mtls.py", &args);
    let mut stdout = job.child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
        s
    });
    // Both tasks connected, passed a barrier and now wait for key `go`.
    let deadline = Instant::now() + Duration::from_secs(180);
    for t in 0..N {
        while !matches!(operator.try_get(&format!("ready/{t}")).await, Ok(Some(_))) {
            if let Ok(Some(status)) = job.child.try_wait() {
                let out = reader.join().unwrap_or_default();
                panic!("the JAX job ended ({status}) before task {t} was ready:\n{out}");
            }
            assert!(Instant::now() < deadline, "task {t} never got ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Task 0's certificate registering as task 1, mid-job: refused at once, by name.
    let as_other = [
        "as".into(),
        follower.clone(),
        ca.clone(),
        prefix.clone(),
        "1".into(),
        pair(0),
    ];
    let started = Instant::now();
    let (code, out) = jax.run("jax_mtls.py", &as_other, Duration::from_secs(240));
    let took = started.elapsed();
    assert_eq!(code, Some(0), "the script itself failed:\n{out}");
    let (connect, _) = connect_result(&out);
    assert_eq!(connect["err"], "PERMISSION_DENIED", "{out}");
    // At once: a refusal without XLA's error payload is retried by jaxlib until its
    // init_timeout (90 s here) before it fails.
    assert!(took < Duration::from_secs(60), "the refusal took {took:?}");
    let message = connect["message"].as_str().unwrap_or_default();
    for words in ["task jax/1", "task jax/0's"] {
        assert!(message.contains(words), "{words:?} not in {message:?}");
    }
    // A client without a certificate: the replica refuses the handshake.
    let plain = ["plain".into(), follower.clone(), "1".into()];
    let (code, out) = jax.run("jax_mtls.py", &plain, Duration::from_secs(240));
    assert_eq!(code, Some(0), "the script itself failed:\n{out}");
    let (connect, exit) = connect_result(&out);
    eprintln!("a client without a certificate: {connect}");
    assert_ne!(exit, 0, "a client without a certificate connected:\n{out}");
    // jaxlib retries a connection refused at the handshake until its init_timeout.
    assert!(
        ["DEADLINE_EXCEEDED", "UNAVAILABLE"].contains(&connect["err"].as_str().unwrap_or("")),
        "{out}"
    );
    assert!(
        cluster
            .log(cluster.other_than(leader))
            .contains("TLS handshake refused"),
        "the follower did not log the refused handshake"
    );

    // Nothing changed: both tasks are still connected, with no error, and the job goes on (a
    // second registration of task 1 would have cut its real process off).
    let states = operator
        .task_states(&[jax_task(0), jax_task(1)])
        .await
        .expect("task states");
    for s in &states.tasks {
        assert_eq!(
            s.state,
            tf::CoordinatedTaskState::TaskstateConnected as i32,
            "{states:?}"
        );
        assert_eq!(s.error_code, 0, "{states:?}");
    }
    operator
        .insert("go", bytes::Bytes::from_static(b"go"), false)
        .await
        .expect("release the job");
    let deadline = Instant::now() + Duration::from_secs(300);
    let code = loop {
        if let Ok(Some(s)) = job.child.try_wait() {
            break s.code();
        }
        assert!(Instant::now() < deadline, "the JAX job did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let out = reader.join().unwrap_or_default();
    assert_eq!(code, Some(0), "{out}");
    let log = parse(&out);
    let errors: Vec<&Value> = log.iter().filter(|e| e.get("err").is_some()).collect();
    assert!(errors.is_empty(), "errors in the job: {errors:#?}");
    for task in 0..u64::from(N) {
        let exit = log
            .iter()
            .find(|e| e["task"] == task && e.get("exit").is_some())
            .unwrap_or_else(|| panic!("no exit line of task {task}:\n{out}"));
        assert_eq!(exit["exit"], 0, "{out}");
        assert_eq!(entry(&log, task, "process_count")["ok"], N, "{out}");
        let peer = (task + 1) % u64::from(N);
        assert_eq!(entry(&log, task, "get_peer")["ok"], format!("v{peer}"));
        assert_eq!(entry(&log, task, "counter")["ok"], N.to_string());
        assert_eq!(
            entry(&log, task, "live_nodes")["ok"],
            serde_json::json!([0, 1])
        );
    }
    assert_eq!(
        increments(&log, u64::from(N)),
        [1, 2],
        "each increment applied once"
    );
}

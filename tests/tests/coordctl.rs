//! `coordctl` as a script uses it: the real binary against a 3-replica ensemble, `-o json`
//! output parsed, exit codes checked; and the metrics it reads beside. Also the habits users
//! bring from etcdctl: endpoint URLs (plain and TLS), a value on stdin, raw output, completions.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use coord_tests::cli::{coordctl, coordctl_json, coordctl_with_stdin};
use coord_tests::cluster::{free_ports, workspace_binary};
use coord_tests::{http, Cluster, ClusterOptions};
use serde_json::Value;

fn json(endpoints: &[String], args: &[&str]) -> Value {
    coordctl_json(endpoints, args)
}

fn worker(i: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: i,
        recoverable: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordctl_reports_the_ensemble_tasks_and_barriers() {
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: ["--job", "worker=2", "--heartbeat-timeout-ms", "60000"]
            .map(String::from)
            .into(),
        ..ClusterOptions::default()
    });
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let eps = cluster.endpoints();

    let status = json(&eps, &["status"]);
    let rows = status.as_array().expect("an array");
    assert_eq!(rows.len(), 3);
    let leaders: Vec<&Value> = rows.iter().filter(|r| r["state"] == "Leader").collect();
    assert_eq!(leaders.len(), 1, "{status}");
    assert_eq!(leaders[0]["id"], leader);
    assert!(rows.iter().all(|r| r["lag"].is_u64()), "{status}");

    let members = json(&eps, &["member", "list"]);
    assert_eq!(members.as_array().map(Vec::len), Some(3), "{members}");
    assert!(members
        .as_array()
        .is_some_and(|m| m.iter().all(|r| r["role"] == "voter")));

    // Task 0 registers and waits at a barrier of both tasks; task 1 never comes.
    let client = CoordClient::new(ClientOptions::new(eps.clone())).expect("client");
    client.register_task(&worker(0), 7).await.expect("register");
    let waiting = {
        let c = client.clone();
        tokio::spawn(async move {
            c.barrier(
                "sync",
                0,
                Duration::from_secs(600),
                &[worker(0), worker(1)],
                &worker(0),
            )
            .await
        })
    };
    // The heartbeat age is the leader's memory: a leader elected since the registration (the
    // machine is loaded) knows none until the task heartbeats, so heartbeat until it is shown.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let tasks = loop {
        client.heartbeat(&worker(0), 7).await.expect("heartbeat");
        let tasks = json(&eps, &["tasks"]);
        let known = tasks.as_array().is_some_and(|t| {
            t.iter()
                .any(|r| r["task"] == "/job:worker/task:0" && r["heartbeat_age_ms"].is_u64())
        });
        if known || std::time::Instant::now() > deadline {
            break tasks;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let row = |name: &str| {
        tasks
            .as_array()
            .and_then(|t| t.iter().find(|r| r["task"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {tasks}"))
    };
    let w0 = row("/job:worker/task:0");
    assert_eq!(w0["state"], "CONNECTED");
    assert_eq!(w0["incarnation"], "0x7");
    assert!(w0["heartbeat_age_ms"].is_u64(), "{w0}");
    assert_eq!(row("/job:worker/task:1")["state"], "DISCONNECTED");

    let mut open = Value::Null;
    cluster
        .wait_until(Duration::from_secs(30), "the barrier to show", |_| {
            open = json(&eps, &["barriers"]);
            open.as_array().is_some_and(|b| !b.is_empty())
        })
        .await;
    let b = &open[0];
    assert_eq!(b["id"], "sync", "{open}");
    assert_eq!(
        b["arrived"],
        serde_json::json!(["/job:worker/replica:0/task:0"])
    );
    assert_eq!(
        b["missing"],
        serde_json::json!(["/job:worker/replica:0/task:1"])
    );
    assert!(b["ms_left"].as_i64().is_some_and(|ms| ms > 0), "{open}");
    // The same, in the leader's metrics.
    let (_, metrics) = http::get(cluster.replica(leader).http, "/metrics").expect("metrics");
    assert!(
        metrics.contains("coord_tasks{state=\"CONNECTED\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("coord_open_barriers 1"), "{metrics}");
    let applied_batches = metrics
        .lines()
        .find_map(|l| l.strip_prefix("coord_apply_latency_seconds_count"))
        .and_then(|rest| rest.rsplit(' ').next()?.trim().parse::<u64>().ok());
    assert!(applied_batches > Some(0), "{metrics}");
    // A table for people: a header and one row per barrier.
    let table = coordctl(&eps, &["barriers"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("ID"), "{text}");
    assert!(text.contains("/job:worker/replica:0/task:1"), "{text}");
    waiting.abort();
    client
        .cancel_barrier("sync", 0, &worker(0))
        .await
        .expect("cancel");
    // One log line for the task's state change and one for the barrier's outcome, on every
    // replica.
    let logged = |log: &str| {
        log.lines().any(|l| {
            l.contains("task state")
                && l.contains("/job:worker/replica:0/task:0")
                && l.contains("CONNECTED")
        }) && log
            .lines()
            .any(|l| l.contains("barrier failed") && l.contains("sync"))
    };
    cluster
        .wait_until(Duration::from_secs(10), "the lines in every log", |c| {
            c.ids().into_iter().all(|id| logged(&c.log(id)))
        })
        .await;

    // Snapshots on every replica.
    let snaps = json(&eps, &["snapshot"]);
    assert!(
        snaps.as_array().is_some_and(
            |s| s.len() == 3 && s.iter().all(|r| r["snapshot_index"].as_u64() > Some(0))
        ),
        "{snaps}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordctl_kv_watch_and_exit_codes() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let eps = cluster.endpoints();

    // A watch prints each change as one JSON line.
    let mut watch = Command::new(workspace_binary("coordctl", None))
        .arg("--endpoints")
        .arg(eps.join(","))
        .args(["-o", "json", "kv", "watch", "cfg"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the watch");
    let mut lines = std::io::BufReader::new(watch.stdout.take().expect("stdout")).lines();
    // The watch starts from the moment it is open: write until it has seen a change.
    let reader = std::thread::spawn(move || lines.next());
    let mut n = 0;
    while !reader.is_finished() {
        assert!(n < 600, "the watch printed nothing");
        let put = coordctl(
            &eps,
            &["kv", "put", "--overwrite", "cfg/lr", &format!("{n}")],
        );
        assert!(put.status.success());
        n += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = watch.kill();
    let _ = watch.wait();
    let line = reader
        .join()
        .expect("reader")
        .expect("a line")
        .expect("utf-8");
    let event: Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(event["kind"], "PUT", "{line}");
    assert_eq!(event["key"], "cfg/lr", "{line}");
    assert!(event["revision"].as_u64() > Some(0), "{line}");

    let got = json(&eps, &["kv", "get", "cfg/lr"]);
    assert_eq!(got["key"], "cfg/lr");

    // Stable exit codes.
    let missing = coordctl(&eps, &["-o", "json", "kv", "try-get", "nope"]);
    assert_eq!(missing.status.code(), Some(3));
    let err: Value = serde_json::from_slice(&missing.stderr).expect("error JSON");
    assert_eq!(err["error"]["code"], "NotFound", "{err}");
    let exists = coordctl(&eps, &["kv", "put", "cfg/lr", "x"]);
    assert_eq!(exists.status.code(), Some(1), "ALREADY_EXISTS is an answer");
    let empty = coordctl(&eps, &["kv", "put", "", "x"]);
    assert_eq!(empty.status.code(), Some(2), "an invalid request");
    let usage = coordctl(&eps, &["kv"]);
    assert_eq!(usage.status.code(), Some(2), "bad usage");
    let nowhere = format!("127.0.0.1:{}", free_ports(1)[0]);
    let unreachable = coordctl(&[nowhere], &["--timeout-secs", "1", "kv", "try-get", "x"]);
    assert_eq!(unreachable.status.code(), Some(4));
}

/// `coordctl run end` ends the job's run by hand: a task parked at a barrier is told, the run's
/// key goes, the task is disconnected and registers into the next run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordctl_ends_a_run() {
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: ["--job", "worker=2", "--heartbeat-timeout-ms", "60000"]
            .map(String::from)
            .into(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let eps = cluster.endpoints();
    // The first coordctl call of the test process builds coordctl if it is stale: before the
    // task's heartbeat clock starts, not after (the task never heartbeats).
    json(&eps, &["status"]);
    let client = CoordClient::new(ClientOptions::new(eps.clone())).expect("client");
    client.register_task(&worker(0), 7).await.expect("register");
    client
        .insert("run/key", "v", false)
        .await
        .expect("a key of the run");
    let waiting = {
        let c = client.clone();
        tokio::spawn(async move {
            c.barrier("sync", 0, Duration::from_secs(600), &[], &worker(0))
                .await
        })
    };
    // Parked before the run ends (the barrier waits for task 1, which never comes).
    let parked = |c: &mut Cluster| {
        c.ids()
            .into_iter()
            .any(|id| c.metric(id, "coord_parked_calls") >= 1.0)
    };
    cluster
        .wait_until(Duration::from_secs(30), "the barrier call to park", parked)
        .await;
    let ended = json(&eps, &["run", "end", "--reason", "test"]);
    assert_eq!(ended[0]["run_begun"], 2, "{ended}");
    let told = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the parked barrier call is answered")
        .expect("join");
    assert_eq!(
        told.expect_err("its run ended").code(),
        tonic::Code::Aborted
    );
    assert!(client.try_get("run/key").await.expect("read").is_none());
    let tasks = json(&eps, &["tasks"]);
    assert!(
        tasks
            .as_array()
            .is_some_and(|t| t.iter().all(|r| r["state"] == "DISCONNECTED")),
        "{tasks}"
    );
    client
        .register_task(&worker(0), 7)
        .await
        .expect("registers into the next run");
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `host:port` as `scheme://host:port/`.
fn urls(endpoints: &[String], scheme: &str) -> Vec<String> {
    endpoints
        .iter()
        .map(|e| format!("{scheme}://{e}/"))
        .collect()
}

/// Endpoints written as URLs (etcdctl's form) reach a plain ensemble and are shown as `host:port`;
/// `https://` without the ensemble's CA, a mix of schemes and other schemes are refused, naming
/// the endpoint. A 4 MiB binary value goes in through stdin and comes back byte for byte with
/// `kv get --raw`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordctl_endpoint_urls_stdin_values_and_raw_output() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let eps = cluster.endpoints();
    let http = urls(&eps, "http");

    let status = json(&http, &["status"]);
    let shown: Vec<&str> = status
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r["endpoint"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(shown, eps, "{status}");
    assert!(
        status.as_array().is_some_and(|rows| rows
            .iter()
            .any(|r| r["state"] == "Leader" && r["id"] == leader)),
        "{status}"
    );

    let https = urls(&eps, "https");
    let refused = coordctl(&https, &["kv", "try-get", "x"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let message = stderr(&refused);
    assert!(message.contains(&format!("{:?}", https[0])), "{message}");
    assert!(message.contains("--tls-ca"), "{message}");
    let mixed = [http[0].clone(), https[1].clone()];
    let refused = coordctl(&mixed, &["kv", "try-get", "x"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("same scheme"),
        "{}",
        stderr(&refused)
    );
    for bad in [format!("ftp://{}", eps[0]), format!("http://{}/v3", eps[0])] {
        let refused = coordctl(std::slice::from_ref(&bad), &["kv", "try-get", "x"]);
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{bad}: {}",
            stderr(&refused)
        );
        let message = stderr(&refused);
        assert!(message.contains(&format!("{bad:?}")), "{message}");
    }

    // The server's default --max-value-bytes is 4 MiB: a value of exactly that, every byte
    // value in it (so not UTF-8), ending in a newline that must survive.
    let mut next = coord_proto::fuzz::xorshift(0x5EED);
    let mut value: Vec<u8> = (0..4 << 20).map(|_| next() as u8).collect();
    value[..256].copy_from_slice(&(0..=255).collect::<Vec<u8>>());
    if let Some(last) = value.last_mut() {
        *last = b'\n';
    }
    let put = coordctl_with_stdin(&http, &["kv", "put", "blob"], value.clone());
    assert!(put.status.success(), "{}", stderr(&put));
    let got = coordctl(&eps, &["kv", "get", "--raw", "blob"]);
    assert!(got.status.success(), "{}", stderr(&got));
    assert_eq!(got.stdout.len(), value.len());
    assert!(got.stdout == value, "the value read back differs");
    // An empty stdin is an empty value; `get` without --raw still adds its newline.
    let put = coordctl_with_stdin(&eps, &["kv", "put", "empty"], Vec::new());
    assert!(put.status.success(), "{}", stderr(&put));
    let got = coordctl(&eps, &["kv", "try-get", "--raw", "empty"]);
    assert!(got.status.success() && got.stdout.is_empty(), "{got:?}");
    let got = coordctl(&eps, &["kv", "get", "empty"]);
    assert_eq!(got.stdout, b"\n");
}

/// `https://` endpoints with the ensemble's CA and an operator's certificate reach a TLS
/// ensemble; `http://` beside `--tls-ca` is refused, naming the endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coordctl_https_endpoints_reach_a_tls_ensemble() {
    let mut cluster = Cluster::start(ClusterOptions {
        tls: true,
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let pki = cluster.pki();
    let files = pki.issue(&pki.client_identity("ops"));
    let (ca, cert, key) = (
        pki.ca_path().display().to_string(),
        files.cert.display().to_string(),
        files.key.display().to_string(),
    );
    let tls = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    let https = urls(&cluster.endpoints(), "https");
    let with = |args: &[&'static str]| [&tls[..], args].concat();

    let put = coordctl(&https, &with(&["kv", "put", "over/tls", "yes"]));
    assert!(put.status.success(), "{}", stderr(&put));
    let got = coordctl(&https, &with(&["kv", "get", "--raw", "over/tls"]));
    assert!(got.status.success(), "{}", stderr(&got));
    assert_eq!(got.stdout, b"yes");

    let http = urls(&cluster.endpoints(), "http");
    let refused = coordctl(&http, &with(&["kv", "get", "over/tls"]));
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let message = stderr(&refused);
    assert!(message.contains(&format!("{:?}", http[0])), "{message}");
    assert!(message.contains("TLS is configured"), "{message}");
}

/// `coordctl completion SHELL` prints a script, needing no ensemble (nothing listens at the
/// endpoints given).
#[test]
fn coordctl_prints_completion_scripts() {
    let nowhere = vec![format!("https://127.0.0.1:{}", free_ports(1)[0])];
    for shell in ["bash", "zsh", "fish"] {
        let out = coordctl(&nowhere, &["completion", shell]);
        assert!(out.status.success(), "{shell}: {}", stderr(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("coordctl"), "{shell}: {script}");
        assert!(
            script.contains("transfer-leader"),
            "{shell}: no subcommands in it"
        );
    }
    let unknown = coordctl(&nowhere, &["completion", "tcsh"]);
    assert_eq!(unknown.status.code(), Some(2));
}

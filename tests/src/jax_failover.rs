//! A JAX job that the test walks through failovers: `tests/jax/xla_failover.py`'s four jaxlib
//! processes, each through a coord-proxy sidecar of its own, driven phase by phase through the
//! key-value store (see the script's docstring), and what they must print when it is over.
//! Shared by the JAX tests and the test that runs every framework's jobs on one ensemble.

use std::thread::JoinHandle;
use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use serde_json::Value;

use crate::jax::{Guarded, Jax, Sidecar};

/// The tasks `xla_failover.py` runs.
pub const FAILOVER_TASKS: usize = 4;

/// The script's JSON lines.
pub fn parse(out: &str) -> Vec<Value> {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

/// Task `task`'s line of operation `op`.
pub fn entry<'a>(log: &'a [Value], task: u64, op: &str) -> &'a Value {
    log.iter()
        .find(|e| e["task"] == task && e["op"] == op)
        .unwrap_or_else(|| panic!("no {op} of task {task} in {log:#?}"))
}

/// What tasks `0..tasks` got from their one increment of a shared counter, in order.
pub fn increments(log: &[Value], tasks: u64) -> Vec<i64> {
    let mut got: Vec<i64> = (0..tasks)
        .map(|t| entry(log, t, "increment")["ok"].as_i64().expect("a number"))
        .collect();
    got.sort_unstable();
    got
}

/// Waits until every key exists (120 s at most).
pub async fn wait_keys(client: &CoordClient, keys: &[String]) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    for k in keys {
        loop {
            if let Ok(Some(_)) = client.try_get(k).await {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "key {k} never appeared"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The exit code of a script's processes, which must finish within 300 s.
pub async fn script_exit(script: &mut Guarded) -> Option<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(Some(s)) = script.child.try_wait() {
            return s.code();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the JAX processes did not finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `xla_failover.py` running: its sidecars, a client of its namespace, its processes.
pub struct FailoverJob {
    _sidecars: Vec<Sidecar>,
    /// Reads and writes the job's keys (in its namespace).
    pub client: CoordClient,
    script: Guarded,
    stdout: JoinHandle<String>,
}

impl FailoverJob {
    /// Starts the job's processes, each through a sidecar started with `sidecar_flags`, in
    /// `namespace` (which those flags declare; `None`: the default one).
    pub fn start(
        jax: &Jax,
        endpoints: &[String],
        sidecar_flags: &[String],
        namespace: Option<&str>,
    ) -> FailoverJob {
        let sidecars: Vec<Sidecar> = (0..FAILOVER_TASKS)
            .map(|_| Sidecar::start_with(endpoints, sidecar_flags))
            .collect();
        let addrs: Vec<String> = sidecars.iter().map(|s| s.addr.clone()).collect();
        let mut options = ClientOptions::new(endpoints.to_vec());
        options.namespace = namespace.map(str::to_string);
        let client = CoordClient::new(options).expect("client");
        let mut script = jax.spawn("xla_failover.py", &addrs);
        let mut out = script.child.stdout.take().expect("stdout");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
            s
        });
        FailoverJob {
            _sidecars: sidecars,
            client,
            script,
            stdout,
        }
    }

    /// Waits until tasks 1.. are at phase `phase`'s barrier (or about to be), task 0 at its
    /// blocking get.
    pub async fn wait_arrived(&self, phase: u32) {
        let arrived: Vec<String> = (1..FAILOVER_TASKS)
            .map(|t| format!("arrived{phase}/{t}"))
            .collect();
        wait_keys(&self.client, &arrived).await;
    }

    /// Releases task 0 from phase `phase`'s blocking get.
    pub async fn go(&self, phase: u32) {
        self.client
            .insert(
                &format!("go/{phase}"),
                bytes::Bytes::from_static(b"go"),
                false,
            )
            .await
            .expect("release task 0");
    }

    /// Waits for the processes to exit and checks what they printed: every task exited 0 with
    /// no error, each increment applied once, both blocking gets, barriers, counter and live
    /// nodes as without a kill (`killed`: the leaders killed, for the message).
    pub async fn finish(mut self, killed: &[u64]) {
        let code = script_exit(&mut self.script).await;
        let out = self.stdout.join().unwrap_or_default();
        assert_failover_log(code, &out, killed);
    }
}

fn assert_failover_log(code: Option<i32>, out: &str, killed: &[u64]) {
    assert_eq!(code, Some(0), "{out}");
    let log = parse(out);
    for task in 0..FAILOVER_TASKS as u64 {
        let exit = log
            .iter()
            .find(|e| e["task"] == task && e.get("exit").is_some())
            .unwrap_or_else(|| panic!("no exit code of task {task}:\n{out}"));
        assert_eq!(exit["exit"], 0, "task {task}:\n{out}");
    }
    let errors: Vec<&Value> = log.iter().filter(|e| e.get("err").is_some()).collect();
    assert!(
        errors.is_empty(),
        "errors after killing leaders {killed:?}: {errors:#?}"
    );
    assert_eq!(
        increments(&log, FAILOVER_TASKS as u64),
        [1, 2, 3, 4],
        "each increment applied once"
    );
    for op in ["get_go1", "get_go2"] {
        assert_eq!(entry(&log, 0, op)["ok"], "go", "{out}");
    }
    for task in 0..FAILOVER_TASKS as u64 {
        for op in ["barrier1", "barrier2", "barrier_after", "shutdown"] {
            assert_eq!(
                entry(&log, task, op)["ok"],
                Value::Null,
                "{op} of task {task}"
            );
        }
        assert_eq!(entry(&log, task, "counter")["ok"], "4");
        assert_eq!(
            entry(&log, task, "live_nodes")["ok"],
            serde_json::json!([0, 1, 2, 3])
        );
    }
}

/// Sidecar flags that put a failover job in namespace `ns`, shaped as the JAX tests' ensemble
/// shapes the default one (job `jax` of [`FAILOVER_TASKS`], their timeouts).
pub fn jax_namespace_flags(ns: &str) -> Vec<String> {
    [
        "--namespace",
        ns,
        "--job",
        &format!("jax={FAILOVER_TASKS}"),
        "--heartbeat-timeout-ms",
        "20000",
        "--shutdown-barrier-timeout-ms",
        "60000",
    ]
    .map(String::from)
    .to_vec()
}

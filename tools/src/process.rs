//! Running this workspace's binaries on this machine: finding them (cargo builds them on first
//! use), free loopback ports for the servers they start, and signals.
//!
//! [`crate::ensemble`] starts replicas with these, and so do the multi-process tests' other
//! processes (`coord-tests` re-exports them from its `cluster` module): one copy, so a demo and a
//! test pick ports and find binaries the same way.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The `coordinator` binary of this workspace, built if needed (once per process).
/// `COORD_BIN` overrides it.
pub fn coordinator_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| workspace_binary("coordinator", Some("COORD_BIN")))
        .clone()
}

/// `target/<profile>` of the running binary (a test, or a tool run from the workspace).
pub fn profile_dir() -> PathBuf {
    running_from().0
}

/// `target/<profile>` of the running binary, and whether it is a test (cargo puts tests in
/// `target/<profile>/deps/`).
fn running_from() -> (PathBuf, bool) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    let in_test = dir.ends_with("deps");
    if in_test {
        dir.pop();
    }
    (dir, in_test)
}

/// Sends signal `sig` (`TERM`, `STOP`, `KILL`, …) to process `target`, or to process group `-target`
/// when `target` is negative.
///
/// Always `kill -s SIG -- TARGET`: procps-ng 4.0's `kill -KILL -12345` reads the group id's first
/// digit as part of an option and calls `kill(-1, SIGKILL)`, which kills every process on the
/// machine (seen with strace: `kill -0 -12345` calls `kill(-1, 0)`).
pub fn send_signal(target: i64, sig: &str) {
    let _ = Command::new("kill")
        .args(["-s", sig, "--", &target.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Binary `bin` of this workspace, built with cargo in the profile of the running binary (a test
/// cannot name another package's binary through `CARGO_BIN_EXE_*`). The environment variable
/// `env_override`, if given and set, names a binary to use instead.
///
/// Built with the dependencies' features resolved for the whole workspace (`--workspace --bin`),
/// and from a test with the test targets too (already fresh under `cargo test --workspace`; their
/// dev-dependencies take part in resolving the features): the features `cargo test --workspace`
/// resolved, so nothing is compiled twice. Built with `-p` of its own package, a binary's
/// dependencies got that package's features only, and on a cold 2-core machine CI's first test
/// waited minutes while cargo compiled a second copy of the dependency tree and of the
/// workspace's crates for the coordinator, and again for coord-agent's binaries.
pub fn workspace_binary(bin: &str, env_override: Option<&str>) -> PathBuf {
    if let Some(p) = env_override.and_then(|v| std::env::var(v).ok()) {
        return PathBuf::from(p);
    }
    // Built once per process.
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, p)) = built.iter().find(|(b, _)| b == bin) {
        return p.clone();
    }
    let (profile_dir, in_test) = running_from();
    let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(workspace)
        .args([
            "build",
            "--quiet",
            "--workspace",
            "--bin",
            bin,
            "--target-dir",
        ])
        .arg(&target_dir);
    if in_test {
        cmd.arg("--tests");
    }
    if profile_dir.ends_with("release") {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for the {bin} binary: {e}"));
    assert!(status.success(), "building the {bin} binary failed");
    let path = profile_dir.join(bin);
    built.push((bin.to_string(), path.clone()));
    path
}

/// `n` distinct free loopback ports for servers the caller starts.
///
/// They come from below the kernel's ephemeral range (`ip_local_port_range`), never from it:
/// a port from `bind(0)` is free only until the server binds it, and meanwhile any outgoing
/// connection on the machine (other tests, other ensembles) may take it as its local port, so
/// the server fails to start or, worse, the test talks to someone else's server. Ports handed out
/// in this process are not handed out again; other processes pick at random, so they rarely meet.
pub fn free_ports(n: usize) -> Vec<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let (low, high) = port_range_below_ephemeral();
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut picked: Vec<(u16, TcpListener)> = Vec::with_capacity(n);
    let mut tries = 0;
    while picked.len() < n {
        tries += 1;
        assert!(tries < 100_000, "no free port in {low}..{high}");
        let port = rand::Rng::gen_range(&mut rand::thread_rng(), low..high);
        if given.contains(&port) || picked.iter().any(|(p, _)| *p == port) {
            continue;
        }
        // Held open while picking, so the ports differ; a port in use is skipped.
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            picked.push((port, l));
        }
    }
    let ports: Vec<u16> = picked.into_iter().map(|(p, _)| p).collect();
    given.extend(&ports);
    ports
}

/// Ports 10000 up to the start of the ephemeral range (32768 by default).
fn port_range_below_ephemeral() -> (u16, u16) {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (10_000, start.max(10_100))
}

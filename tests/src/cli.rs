//! `coordctl` as a test script runs it: the real binary, its output and exit code.

use std::process::{Command, Output};

use serde_json::Value;

use crate::cluster::workspace_binary;

/// Runs `coordctl --endpoints ... ARGS`.
pub fn coordctl(endpoints: &[String], args: &[&str]) -> Output {
    Command::new(workspace_binary("coordctl", None))
        .arg("--endpoints")
        .arg(endpoints.join(","))
        .args(args)
        .output()
        .expect("run coordctl")
}

/// Runs `coordctl -o json ARGS`, expects success, parses stdout.
pub fn coordctl_json(endpoints: &[String], args: &[&str]) -> Value {
    let mut all = vec!["-o", "json"];
    all.extend(args);
    let out = coordctl(endpoints, &all);
    assert!(
        out.status.success(),
        "coordctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "coordctl {args:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Runs `coordctl --endpoints ... ARGS` with `input` on its stdin.
pub fn coordctl_with_stdin(endpoints: &[String], args: &[&str], input: Vec<u8>) -> Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = Command::new(workspace_binary("coordctl", None))
        .arg("--endpoints")
        .arg(endpoints.join(","))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run coordctl");
    let mut stdin = child.stdin.take().expect("stdin");
    // From another thread: coordctl may answer (and stop reading) before taking all of it.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().expect("coordctl's output");
    writer.join().expect("the stdin writer");
    out
}

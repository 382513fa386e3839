//! `coordctl` as a test script runs it: the real binary, its output and exit code.

use std::process::{Command, Output};

use serde_json::Value;

use crate::cluster::workspace_binary;

/// Runs `coordctl --endpoints ... ARGS`.
pub fn coordctl(endpoints: &[String], args: &[&str]) -> Output {
    Command::new(workspace_binary("coord-agent", "coordctl", None))
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

//! Records the commit the coordinator is built from, for `--version` and `coord_build_info`:
//! `COORD_COMMIT` from the environment when set (an image built without `.git`, see
//! deploy/Dockerfile), else `git rev-parse`, else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=COORD_COMMIT");
    // A new commit moves HEAD or the branch it names; packed refs cover a branch after gc.
    for path in ["../.git/HEAD", "../.git/packed-refs"] {
        println!("cargo:rerun-if-changed={path}");
    }
    if let Ok(head) = std::fs::read_to_string("../.git/HEAD") {
        if let Some(branch) = head.trim().strip_prefix("ref: ") {
            println!("cargo:rerun-if-changed=../.git/{branch}");
        }
    }
    let commit = std::env::var("COORD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=COORD_COMMIT={}", commit.trim());
}

fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    String::from_utf8(out.stdout).ok()
}

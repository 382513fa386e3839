//! Records the commit the coordinator is built from, for `--version` and `coord_build_info`:
//! `COORD_COMMIT` from the environment when set (an image built without `.git`, see
//! deploy/Dockerfile), else `git rev-parse`, else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=COORD_COMMIT");
    // A new commit moves HEAD or the branch it names; packed refs cover a branch after gc. Paths
    // are git's own (a worktree's HEAD is not `../.git/HEAD`): a path that does not exist would
    // make cargo run this script, and rebuild the crate, on every build.
    for name in ["HEAD", "packed-refs"] {
        if let Some(path) = git_path(name) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let head = git_path("HEAD").and_then(|p| std::fs::read_to_string(p).ok());
    if let Some(branch) = head.as_deref().and_then(|h| h.trim().strip_prefix("ref: ")) {
        if let Some(path) = git_path(branch) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("COORD_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=COORD_COMMIT={}", commit.trim());
}

/// Where git keeps `name` (`HEAD`, `packed-refs`, `refs/heads/main`) for this checkout, if it
/// exists.
fn git_path(name: &str) -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--git-path", name])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    std::path::Path::new(&path).exists().then_some(path)
}

fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    String::from_utf8(out.stdout).ok()
}

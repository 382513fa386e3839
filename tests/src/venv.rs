//! Python venvs for the tests and benchmarks that run a real Python library ([`crate::jax`]'s
//! jaxlib client, [`crate::tfdata`]'s TensorFlow peer), and the guard that kills their processes.
//!
//! A venv is made once per target directory (`target/<name>`), under a file lock
//! (`target/<name>.lock`) so that concurrent test processes share it, and is ready once its
//! `installed` marker exists. Where it cannot be made (no CPython 3.11, PyPI out of reach), the
//! error says why, and the callers skip with that reason.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::cluster::profile_dir;

/// A child process killed (with its whole process group) when dropped.
pub struct Guarded {
    pub child: Child,
}

impl Guarded {
    pub fn kill(&mut self) {
        // The Python scripts start helper processes: kill the group they share.
        crate::cluster::send_signal(-i64::from(self.child.id()), "KILL");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// What to install in a venv, and how to name it in messages.
pub struct VenvSpec<'a> {
    /// The venv's directory under the target directory (also names its lock file).
    pub dir_name: &'a str,
    /// The pip requirements, e.g. `tensorflow-cpu==2.21.0`.
    pub requirements: &'a [String],
    /// Names what is installed in the "installing ... from PyPI" line.
    pub describe: &'a str,
    /// Names what is installed in the error when pip fails.
    pub short: &'a str,
    /// Written to the `installed` marker.
    pub marker: &'a str,
}

fn python_for_venv() -> Option<&'static str> {
    ["python3.11", "python3"].into_iter().find(|p| {
        Command::new(p)
            .args(["-c", "import sys; assert sys.version_info[:2] == (3, 11)"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// The last `lines` lines of `bytes`, as text.
pub fn tail(bytes: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl VenvSpec<'_> {
    /// The venv's Python, the venv made if needed; `Err` says why it cannot be had here.
    pub fn python(&self) -> Result<PathBuf, String> {
        let target = profile_dir()
            .parent()
            .ok_or("no target directory")?
            .to_path_buf();
        let venv = target.join(self.dir_name);
        let python = venv.join("bin").join("python");
        let ready = venv.join("installed");
        let lock = File::create(target.join(format!("{}.lock", self.dir_name)))
            .map_err(|e| format!("cannot create the venv lock: {e}"))?;
        lock.lock()
            .map_err(|e| format!("cannot take the venv lock: {e}"))?;
        if ready.exists() {
            return Ok(python);
        }
        let base = python_for_venv().ok_or("no CPython 3.11 on this machine")?;
        let _ = std::fs::remove_dir_all(&venv);
        let out = Command::new(base)
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .map_err(|e| format!("{base} -m venv: {e}"))?;
        if !out.status.success() {
            return Err(format!("{base} -m venv failed: {}", tail(&out.stderr, 5)));
        }
        eprintln!(
            "installing {} from PyPI into {}",
            self.describe,
            venv.display()
        );
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(self.requirements)
            .output()
            .map_err(|e| format!("pip: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pip could not install {} (is PyPI reachable?): {}",
                self.short,
                tail(&out.stderr, 5)
            ));
        }
        std::fs::write(&ready, self.marker).map_err(|e| e.to_string())?;
        Ok(python)
    }
}

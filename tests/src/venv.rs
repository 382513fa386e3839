//! Python venvs for the tests and benchmarks that run a real Python library ([`crate::jax`]'s
//! jaxlib client, [`crate::tfdata`]'s TensorFlow peer), and the guard that kills their processes.
//!
//! A venv is made once per target directory (`target/<name>`), under a file lock
//! (`target/<name>.lock`) so that concurrent test processes share it, and is ready once its
//! `installed` marker exists. The spec names the CPython releases it may be made with; the first
//! one found on this machine is used (see [`Interpreter`]). Where it cannot be made (no such
//! CPython, PyPI out of reach), the error says why, and the callers skip with that reason.

use std::fs::File;
use std::path::{Path, PathBuf};
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

/// The CPython releases a venv may be made with, most wanted first: each as `(3, minor)`.
#[derive(Clone, Copy, Debug)]
pub struct Interpreter(pub &'static [(u32, u32)]);

/// CPython 3.11: what the TensorFlow, torch and older jaxlib wheels the tests pin are built for.
pub const CPYTHON_3_11: Interpreter = Interpreter(&[(3, 11)]);

impl Interpreter {
    /// Names the releases in messages: "CPython 3.13 or 3.12".
    pub fn describe(&self) -> String {
        let versions: Vec<String> = self.0.iter().map(|(a, b)| format!("{a}.{b}")).collect();
        format!("CPython {}", versions.join(" or "))
    }

    /// The first interpreter of one of these releases on this machine: `python3.X` on the PATH,
    /// then pyenv's installed versions (`$PYENV_ROOT`, or `~/.pyenv`, `versions/*/bin/python3.X`:
    /// pyenv's shims on the PATH run only the version pyenv has selected), then `python3`.
    pub fn find(&self) -> Option<PathBuf> {
        let pyenv = std::env::var_os("PYENV_ROOT")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")));
        let installed: Vec<PathBuf> = pyenv
            .and_then(|root| std::fs::read_dir(root.join("versions")).ok())
            .map(|dirs| dirs.flatten().map(|d| d.path().join("bin")).collect())
            .unwrap_or_default();
        self.0.iter().find_map(|&(major, minor)| {
            let name = format!("python{major}.{minor}");
            std::iter::once(PathBuf::from(&name))
                .chain(installed.iter().map(|bin| bin.join(&name)))
                .chain(std::iter::once(PathBuf::from("python3")))
                .find(|p| is_release(p, major, minor))
        })
    }
}

/// Whether `python` runs and is CPython `major.minor`.
fn is_release(python: &Path, major: u32, minor: u32) -> bool {
    let check = format!(
        "import sys; assert sys.implementation.name == 'cpython' and \
         sys.version_info[:2] == ({major}, {minor})"
    );
    Command::new(python)
        .args(["-c", &check])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What to install in a venv, and how to name it in messages.
pub struct VenvSpec<'a> {
    /// The venv's directory under the target directory (also names its lock file).
    pub dir_name: &'a str,
    /// The CPython releases the venv may be made with.
    pub interpreter: Interpreter,
    /// The pip requirements, e.g. `tensorflow-cpu==2.21.0`.
    pub requirements: &'a [String],
    /// Names what is installed in the "installing ... from PyPI" line.
    pub describe: &'a str,
    /// Names what is installed in the error when pip fails.
    pub short: &'a str,
    /// Written to the `installed` marker.
    pub marker: &'a str,
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
        let base = self.interpreter.find().ok_or_else(|| {
            format!(
                "no {} on this machine (for {})",
                self.interpreter.describe(),
                self.short
            )
        })?;
        let _ = std::fs::remove_dir_all(&venv);
        let out = Command::new(&base)
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .map_err(|e| format!("{} -m venv: {e}", base.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} -m venv failed: {}",
                base.display(),
                tail(&out.stderr, 5)
            ));
        }
        eprintln!(
            "installing {} from PyPI into {} (with {})",
            self.describe,
            venv.display(),
            base.display()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A release nobody has is not found, and the venv's error names what was looked for (the
    /// reason the tests print when they skip).
    #[test]
    fn a_missing_interpreter_is_named() {
        let none = Interpreter(&[(3, 99), (3, 98)]);
        assert_eq!(none.describe(), "CPython 3.99 or 3.98");
        assert_eq!(none.find(), None);
        let err = VenvSpec {
            dir_name: "venv-of-a-missing-python",
            interpreter: none,
            requirements: &[],
            describe: "nothing",
            short: "nothing",
            marker: "",
        }
        .python()
        .expect_err("no CPython 3.99 here");
        assert!(err.contains("no CPython 3.99 or 3.98"), "{err}");
    }

    /// The interpreter found is the release asked for.
    #[test]
    fn the_interpreter_found_is_of_the_release() {
        let releases: [&'static [(u32, u32)]; 3] = [&[(3, 11)], &[(3, 12)], &[(3, 13)]];
        for release in releases {
            if let Some(python) = Interpreter(release).find() {
                let (major, minor) = release[0];
                assert!(is_release(&python, major, minor), "{}", python.display());
            }
        }
    }
}

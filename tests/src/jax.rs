//! The real jaxlib client, for the tests of the XLA surface: Python venvs with `jax` and `jaxlib`
//! from PyPI, one per [`JaxRelease`] the tests run, the scripts under `tests/jax/`, and coord-proxy
//! sidecars.
//!
//! A venv is made once per target directory (`target/jax-venv-<version>`, under a file lock so
//! that concurrent test processes share it), with the CPython its release's wheels need. Where it
//! cannot be made (no such CPython, PyPI out of reach), [`Jax::get`] says why and the tests skip
//! with that reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{free_ports, workspace_binary};
pub use crate::venv::Guarded;
use crate::venv::{Interpreter, VenvSpec, CPYTHON_3_11};

/// A jaxlib release the tests run, and the CPython it is installed with.
#[derive(Clone, Copy, Debug)]
pub struct JaxRelease {
    /// `jax` and `jaxlib` are pinned to the same version.
    pub version: &'static str,
    pub interpreter: Interpreter,
}

/// jaxlib 0.10: the first line that speaks `xla.coordination`, and the newest PyPI offers CPython
/// 3.11.
pub const JAX_0_10: JaxRelease = JaxRelease {
    version: "0.10.2",
    interpreter: CPYTHON_3_11,
};

/// The newest jaxlib; it needs CPython 3.12 or later. It also speaks mTLS itself (jaxlib 0.11.2
/// and later).
pub const JAX_0_12: JaxRelease = JaxRelease {
    version: "0.12.0.1",
    interpreter: Interpreter(&[(3, 13), (3, 12)]),
};

pub struct Jax {
    python: PathBuf,
}

impl Jax {
    /// The venv with jax and jaxlib of `release`, made if needed; `Err` says why it cannot be had
    /// here.
    pub fn get(release: JaxRelease) -> Result<Jax, String> {
        let v = release.version;
        let python = VenvSpec {
            dir_name: &format!("jax-venv-{v}"),
            interpreter: release.interpreter,
            requirements: &[format!("jax=={v}"), format!("jaxlib=={v}")],
            describe: &format!("jax and jaxlib {v}"),
            short: &format!("jax/jaxlib {v}"),
            marker: v,
        }
        .python()?;
        Ok(Jax { python })
    }

    /// The path of a script under `tests/jax/`.
    pub fn script(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("jax").join(name)
    }

    /// Starts `script args...` in its own process group, stdout piped.
    pub fn spawn(&self, script: &str, args: &[String]) -> Guarded {
        let mut cmd = Command::new(&self.python);
        cmd.arg(Self::script(script))
            .args(args)
            .env("PYTHONUNBUFFERED", "1")
            // jaxlib's client logs through absl; keep it to warnings.
            .env("TF_CPP_MIN_LOG_LEVEL", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        Guarded {
            child: cmd.spawn().expect("start python"),
        }
    }

    /// Runs `script args...` to its end (killed at `timeout`); returns its exit code and stdout.
    pub fn run(&self, script: &str, args: &[String], timeout: Duration) -> (Option<i32>, String) {
        let mut g = self.spawn(script, args);
        let mut stdout = g.child.stdout.take().expect("piped stdout");
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
            s
        });
        let deadline = Instant::now() + timeout;
        let code = loop {
            if let Ok(Some(status)) = g.child.try_wait() {
                break status.code();
            }
            if Instant::now() > deadline {
                eprintln!("{script} still running after {timeout:?}: killed");
                g.kill();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        // Helpers the script left behind would hold stdout open.
        g.kill();
        (code, reader.join().unwrap_or_default())
    }
}

/// A coord-proxy sidecar in front of `endpoints`; killed when dropped.
pub struct Sidecar {
    pub addr: String,
    _proc: Guarded,
}

impl Sidecar {
    pub fn start(endpoints: &[String]) -> Sidecar {
        Self::start_with(endpoints, &[])
    }

    /// A sidecar with extra flags (e.g. `--tls-ca`, `--tls-cert`, `--tls-key`).
    pub fn start_with(endpoints: &[String], extra: &[String]) -> Sidecar {
        let bin = workspace_binary("coord-proxy", Some("COORD_PROXY_BIN"));
        let port = free_ports(1)[0];
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(bin);
        cmd.arg("--listen")
            .arg(&addr)
            .arg("--coordinators")
            .arg(endpoints.join(","))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let proc = Guarded {
            child: cmd.spawn().expect("start coord-proxy"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "coord-proxy did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Sidecar { addr, _proc: proc }
    }
}

//! Real torch for the tests and the benchmark of torch's store: a venv with `torch` 2.15.0 from
//! PyPI (CPU; the Linux wheel imports only with its CUDA libraries, so they come along: about
//! 3 GB), the scripts under `tests/torch/`, and coord-proxy sidecars serving torch's TCPStore.
//!
//! The venv is made once per target directory (`target/torch-venv-<version>`, under a file lock so
//! that concurrent test processes share it). Where it cannot be made (no Python 3.11, PyPI out of
//! reach), [`Torch::get`] says why and the callers skip with that reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{free_ports, workspace_binary};
pub use crate::venv::Guarded;
use crate::venv::{VenvSpec, CPYTHON_3_11};

/// The torch release the tests run.
pub const TORCH_VERSION: &str = "2.15.0";

pub struct Torch {
    python: PathBuf,
}

impl Torch {
    /// The venv for `test`, or `None` with the reason printed (`SKIPPED test: why`) where it
    /// cannot be had here.
    pub fn or_skip(test: &str) -> Option<Torch> {
        match Torch::get() {
            Ok(t) => Some(t),
            Err(why) => {
                eprintln!("SKIPPED {test}: {why}");
                None
            }
        }
    }

    /// The venv with torch, made if needed; `Err` says why it cannot be had here.
    pub fn get() -> Result<Torch, String> {
        let python = VenvSpec {
            dir_name: &format!("torch-venv-{TORCH_VERSION}"),
            interpreter: CPYTHON_3_11,
            // numpy only keeps torch from warning at import.
            requirements: &[format!("torch=={TORCH_VERSION}"), "numpy".to_string()],
            describe: &format!("torch {TORCH_VERSION} (about 3 GB with its CUDA libraries)"),
            short: &format!("torch {TORCH_VERSION}"),
            marker: TORCH_VERSION,
        }
        .python()?;
        Ok(Torch { python })
    }

    /// The venv's Python.
    pub fn python(&self) -> &Path {
        &self.python
    }

    /// The venv's `bin/` (torchrun lives there).
    pub fn bin(&self) -> PathBuf {
        self.python
            .parent()
            .map_or_else(PathBuf::new, Path::to_path_buf)
    }

    /// The path of a script under `tests/torch/`.
    pub fn script(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("torch")
            .join(name)
    }

    /// A command running the venv's `program` (`python`, `torchrun`) in a process group of its
    /// own, unbuffered, stdout piped.
    pub fn command(&self, program: &str) -> Command {
        self.command_under(Command::new(self.bin().join(program)))
    }

    /// `launcher` (a command that runs one of the venv's programs, `self.bin()`, in some
    /// environment of its own) with the environment and output of [`Torch::command`].
    pub fn command_under(&self, launcher: Command) -> Command {
        let mut cmd = launcher;
        cmd.env("PYTHONUNBUFFERED", "1")
            // Gloo on loopback, no GPU probing noise.
            .env("GLOO_SOCKET_IFNAME", "lo")
            .env("CUDA_VISIBLE_DEVICES", "")
            .env("OMP_NUM_THREADS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd
    }

    /// Runs `script args...` to its end (its process group killed at `timeout`); its exit code
    /// and stdout.
    pub fn run(&self, script: &str, args: &[String], timeout: Duration) -> (Option<i32>, String) {
        let mut cmd = self.command("python");
        cmd.arg(Self::script(script)).args(args);
        run_to_end(cmd, timeout)
    }
}

/// Runs `cmd` (made by [`Torch::command`]) to its end, killed with its process group at
/// `timeout`; its exit code and stdout.
pub fn run_to_end(mut cmd: Command, timeout: Duration) -> (Option<i32>, String) {
    let mut g = Guarded {
        child: cmd.spawn().expect("start a torch process"),
    };
    let out = g.child.stdout.take().map(|mut stdout| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
            s
        })
    });
    let deadline = Instant::now() + timeout;
    let code = loop {
        if let Ok(Some(status)) = g.child.try_wait() {
            break status.code();
        }
        if Instant::now() > deadline {
            eprintln!("{cmd:?} still running after {timeout:?}: killed");
            g.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Helpers left behind would hold stdout open.
    g.kill();
    (code, out.and_then(|t| t.join().ok()).unwrap_or_default())
}

/// A coord-proxy serving torch's TCPStore (and its gRPC services) in front of `endpoints`;
/// killed when dropped.
pub struct StoreSidecar {
    /// torch's store address, `127.0.0.1:PORT`.
    pub store: String,
    pub port: u16,
    proc: Guarded,
}

impl StoreSidecar {
    pub fn start(endpoints: &[String]) -> StoreSidecar {
        Self::start_with(endpoints, &[])
    }

    /// The same, with more coord-proxy flags (`--namespace NAME`, a job's shape).
    pub fn start_with(endpoints: &[String], extra: &[&str]) -> StoreSidecar {
        let bin = workspace_binary("coord-proxy", Some("COORD_PROXY_BIN"));
        let ports = free_ports(2);
        let store = format!("127.0.0.1:{}", ports[1]);
        let mut cmd = Command::new(bin);
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", ports[0]))
            .arg("--tcpstore-listen")
            .arg(&store)
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
        while std::net::TcpStream::connect(&store).is_err() {
            assert!(
                Instant::now() < deadline,
                "coord-proxy did not listen on {store}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        StoreSidecar {
            store,
            port: ports[1],
            proc,
        }
    }

    /// Whether the sidecar process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.proc.child.try_wait(), Ok(None))
    }

    /// kill -9 (its host dying).
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Sends `sig` (`TERM`, `INT`) to the sidecar.
    pub fn signal(&self, sig: &str) {
        crate::cluster::send_signal(i64::from(self.proc.child.id()), sig);
    }

    /// Waits up to `timeout` for the sidecar to exit; its exit status (`None`: still running).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.proc.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

//! The ensemble of `deploy/compose.yaml` in real containers, for the deployment tests: builds the
//! image offline (`deploy/build-offline-image.sh`), brings the project up on free host ports under
//! a project name of its own, and takes everything down (containers, network, volumes, image)
//! when dropped, whatever the test's outcome.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::cluster::{free_ports, profile_dir, workspace_binary};

/// Why containers cannot run here, if they cannot.
pub fn unavailable() -> Option<String> {
    let ok = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !ok("docker", &["info"]) {
        return Some("no Docker engine answers (`docker info` failed)".into());
    }
    if !ok("docker-compose", &["version"]) {
        return Some("docker-compose is not installed".into());
    }
    None
}

pub struct Compose {
    pub project: String,
    pub image: String,
    file: PathBuf,
    /// Override files after `deploy/compose.yaml` (e.g. `deploy/compose.tls.yaml`).
    overrides: Vec<PathBuf>,
    /// Variables for the compose files.
    env: Vec<(String, String)>,
    /// Host ports: gRPC and HTTP of replicas 1..=4.
    grpc: Vec<u16>,
    http: Vec<u16>,
}

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run docker");
    if !out.status.success() {
        eprintln!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

impl Compose {
    /// Builds the image from this profile's binaries and starts replicas 1–3.
    pub fn up() -> Compose {
        Self::up_with(&[], &[])
    }

    /// [`Compose::up`] with override files (under `deploy/`) and variables for them.
    pub fn up_with(overrides: &[&str], env: &[(&str, &str)]) -> Compose {
        for (pkg, bin) in [
            ("coord-server", "coordinator"),
            ("coord-agent", "coordctl"),
            ("coord-agent", "coord-proxy"),
        ] {
            workspace_binary(pkg, bin, None);
        }
        let tag = format!("coordtest{}", rand::random::<u32>());
        let image = format!("coord:{tag}");
        let built = run(
            Command::new(workspace().join("deploy/build-offline-image.sh"))
                .arg(&image)
                .arg(profile_dir()),
        );
        assert!(built.status.success(), "building the image failed");
        let ports = free_ports(8);
        let c = Compose {
            project: tag,
            image,
            file: workspace().join("deploy/compose.yaml"),
            overrides: overrides
                .iter()
                .map(|f| workspace().join("deploy").join(f))
                .collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            grpc: ports[..4].to_vec(),
            http: ports[4..].to_vec(),
        };
        let out = run(c.compose().args(["up", "-d", "coord1", "coord2", "coord3"]));
        assert!(out.status.success(), "docker-compose up failed");
        c
    }

    fn compose(&self) -> Command {
        let mut cmd = Command::new("docker-compose");
        cmd.arg("-p").arg(&self.project).arg("-f").arg(&self.file);
        for f in &self.overrides {
            cmd.arg("-f").arg(f);
        }
        cmd.args(["--profile", "join"])
            .env("COORD_IMAGE", &self.image)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        for i in 0..4 {
            cmd.env(format!("COORD{}_GRPC", i + 1), self.grpc[i].to_string());
            cmd.env(format!("COORD{}_HTTP", i + 1), self.http[i].to_string());
        }
        cmd
    }

    /// Runs `docker-compose <args>` for this project; panics if it fails.
    pub fn compose_ok(&self, args: &[&str]) {
        let out = run(self.compose().args(args));
        assert!(out.status.success(), "docker-compose {args:?} failed");
    }

    /// Runs `docker <args>`; panics if it fails.
    pub fn docker_ok(&self, args: &[&str]) {
        let out = run(Command::new("docker").args(args));
        assert!(out.status.success(), "docker {args:?} failed");
    }

    /// The container of replica `id` (compose v1 naming).
    pub fn container(&self, id: u64) -> String {
        format!("{}_coord{id}_1", self.project)
    }

    pub fn network(&self) -> String {
        format!("{}_coord", self.project)
    }

    /// Replica `id`'s gRPC port on the host.
    pub fn grpc(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.grpc[id as usize - 1])
    }

    /// Replica `id`'s HTTP port on the host.
    pub fn http(&self, id: u64) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.http[id as usize - 1]))
    }

    /// The last lines of every replica's log, for a failing test.
    pub fn logs(&self) -> String {
        let out = self
            .compose()
            .args(["logs", "--no-color", "--tail", "40"])
            .output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for Compose {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("=== container logs ===\n{}", self.logs());
        }
        let _ = self
            .compose()
            .args(["down", "-v", "--remove-orphans", "-t", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("docker")
            .args(["rmi", "-f", &self.image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

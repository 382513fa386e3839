//! The ensemble of `deploy/compose.yaml` in real containers, for the deployment tests: builds
//! coord's images offline (`deploy/build-offline-image.sh`) from this workspace's release binaries,
//! as they ship, brings the project up on free host ports under a project name of its own, runs
//! other containers (the sidecar) beside it, and takes everything down (containers, network,
//! volumes, images) when dropped, whatever the test's outcome.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::cluster::{free_ports, profile_dir};

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

/// `target/release` of this workspace, with `coordinator`, `coordctl` and `coord-proxy` built
/// there (once per process): the images hold release binaries whatever profile the tests run in,
/// so that what is measured and run is what ships.
pub fn release_binaries() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let target = profile_dir().parent().expect("target dir").to_path_buf();
        let status = Command::new(env!("CARGO"))
            .current_dir(workspace())
            .args(["build", "--quiet", "--release"])
            .args(["-p", "coord-server", "--bin", "coordinator"])
            .args(["-p", "coord-agent", "--bin", "coordctl"])
            .args(["--bin", "coord-proxy"])
            .arg("--target-dir")
            .arg(&target)
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the release binaries failed");
        target.join("release")
    })
    .clone()
}

/// One of coord's images, a target of `deploy/Dockerfile` (`coordinator` or `coord-proxy`) built
/// offline from [`release_binaries`] under a name of its own; removed when dropped.
pub struct Image {
    pub name: String,
}

impl Image {
    pub fn build(target: &str) -> Image {
        let image = Image {
            name: format!("coordtest-{target}:{}", rand::random::<u32>()),
        };
        let built = run(
            Command::new(workspace().join("deploy/build-offline-image.sh"))
                .args(["--target", target])
                .arg(&image.name)
                .arg(release_binaries()),
        );
        assert!(built.status.success(), "building the {target} image failed");
        image
    }

    /// The image's size in bytes, as `docker image ls` counts it.
    pub fn size(&self) -> u64 {
        let out =
            run(Command::new("docker").args(["image", "inspect", "-f", "{{.Size}}", &self.name]));
        assert!(
            out.status.success(),
            "docker image inspect {} failed",
            self.name
        );
        let size = String::from_utf8_lossy(&out.stdout);
        size.trim()
            .parse()
            .unwrap_or_else(|_| panic!("image size {size:?}"))
    }

    /// Copies `path` out of the image (a container created, never started, and removed) to `dest`.
    pub fn copy_out(&self, path: &str, dest: &Path) {
        let name = format!("coordtest-copy{}", rand::random::<u32>());
        let created = run(Command::new("docker").args(["create", "--name", &name, &self.name]));
        assert!(
            created.status.success(),
            "docker create {} failed",
            self.name
        );
        let copied = run(Command::new("docker")
            .arg("cp")
            .arg(format!("{name}:{path}"))
            .arg(dest));
        // -v: coordinator's image declares a volume, made with the container.
        quiet(Command::new("docker").args(["rm", "-f", "-v", &name]));
        assert!(
            copied.status.success(),
            "docker cp {}:{path} failed",
            self.name
        );
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        quiet(Command::new("docker").args(["rmi", "-f", &self.name]));
    }
}

/// A container `docker run` beside a [`Compose`] project, on its network; removed when dropped.
/// It borrows the project, so it is gone before the project's network is taken down.
pub struct Container<'a> {
    pub name: String,
    project: PhantomData<&'a Compose>,
}

impl Container<'_> {
    /// Whether `docker exec` of `cmd` in the container succeeds (as a Kubernetes exec probe).
    pub fn exec_ok(&self, cmd: &[String]) -> bool {
        Command::new("docker")
            .args(["exec", &self.name])
            .args(cmd)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `docker inspect -f FORMAT` of the container.
    pub fn inspect(&self, format: &str) -> String {
        let out = run(Command::new("docker").args(["inspect", "-f", format, &self.name]));
        assert!(out.status.success(), "docker inspect {} failed", self.name);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn logs(&self) -> String {
        Command::new("docker")
            .args(["logs", "--tail", "40", &self.name])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr)
            })
            .unwrap_or_default()
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("=== {} logs ===\n{}", self.name, self.logs());
        }
        quiet(Command::new("docker").args(["rm", "-f", "-v", &self.name]));
    }
}

pub struct Compose {
    pub project: String,
    pub image: Image,
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

/// Runs `cmd`, ignoring its outcome and output (cleaning up).
fn quiet(cmd: &mut Command) {
    let _ = cmd.stdout(Stdio::null()).stderr(Stdio::null()).status();
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
    /// Builds the coordinator's image and starts replicas 1–3.
    pub fn up() -> Compose {
        Self::up_with(&[], &[])
    }

    /// [`Compose::up`] with override files (under `deploy/`) and variables for them.
    pub fn up_with(overrides: &[&str], env: &[(&str, &str)]) -> Compose {
        let image = Image::build("coordinator");
        let ports = free_ports(8);
        let c = Compose {
            project: format!("coordtest{}", rand::random::<u32>()),
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
            .env("COORD_IMAGE", &self.image.name)
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

    /// `docker run -d` of `image` with `args` on the project's network, beside the replicas (which
    /// it reaches by their service names); `options` go to `docker run` (`-p`, `-v`, `-e`).
    pub fn run(&self, options: &[&str], image: &Image, args: &[&str]) -> Container<'_> {
        let container = Container {
            name: format!("{}_run{}", self.project, rand::random::<u16>()),
            project: PhantomData,
        };
        let out = run(Command::new("docker")
            .args([
                "run",
                "-d",
                "--name",
                &container.name,
                "--network",
                &self.network(),
            ])
            .args(options)
            .arg(&image.name)
            .args(args));
        assert!(out.status.success(), "docker run {} failed", image.name);
        container
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
        // The image goes after this, with the field.
        quiet(
            self.compose()
                .args(["down", "-v", "--remove-orphans", "-t", "5"]),
        );
    }
}

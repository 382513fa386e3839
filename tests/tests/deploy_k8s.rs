//! The Kubernetes manifests of `deploy/k8s`, checked without a cluster: every pod template
//! (StatefulSet, Job, Pod, ...) against the "restricted" Pod Security Standard, and against what
//! this project needs of them: pinned images (coord's two at the workspace version), requests and
//! limits on every container, a memory limit that fits the memory quota, the images' user,
//! graceful termination long enough for a leader handoff, and `coord-proxy` as a native sidecar
//! in the training Job, from its own image, so that the Job completes when the trainer exits.
//!
//! The manifests are read as they are on disk; where `kubectl` is installed the kustomizations are
//! also rendered (`kubectl kustomize`, which applies their patches and refuses a broken layout) and
//! the rendered pods checked again. Every problem names the file, the object and the field.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_yaml::Value;

// In a directory of its own: a file beside this one would be a test target of its own.
#[path = "deploy_k8s/pods.rs"]
mod pods;

use pods::{at, check_objects, runs_proxy, seq, text, Rules};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// The workspace version (`[workspace.package]` of the root Cargo.toml): coord's image tag.
fn workspace_version() -> String {
    let text = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if let Some(v) = line.strip_prefix("version").filter(|_| in_package) {
            return v
                .trim_start_matches([' ', '='])
                .trim_matches('"')
                .to_string();
        }
    }
    panic!("no version in [workspace.package] of Cargo.toml");
}

/// The images a Dockerfile ships, by target (every stage with an `ENTRYPOINT`), with the user and
/// group each runs as: its stage's last `USER uid:gid`.
fn image_users(dockerfile: &str) -> Vec<(String, (i64, i64))> {
    let path = workspace().join(dockerfile);
    let text = std::fs::read_to_string(&path).expect("Dockerfile");
    let mut stages: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(from) = line.strip_prefix("FROM ") {
            let name = match from.split_whitespace().collect::<Vec<_>>().as_slice() {
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => name.to_string(),
                _ => format!("stage {}", stages.len()),
            };
            stages.push((name, Vec::new()));
        } else if let Some((_, lines)) = stages.last_mut() {
            lines.push(line);
        }
    }
    let images: Vec<(String, (i64, i64))> = stages
        .iter()
        .filter(|(_, lines)| lines.iter().any(|l| l.starts_with("ENTRYPOINT ")))
        .map(|(name, lines)| {
            let user = lines
                .iter()
                .rev()
                .find_map(|l| l.strip_prefix("USER "))
                .unwrap_or_else(|| {
                    panic!("{dockerfile}: target {name}: no USER: the image would run as root")
                });
            let (uid, gid) = user.trim().split_once(':').unwrap_or_else(|| {
                panic!("{dockerfile}: target {name}: USER {user} names no group (want uid:gid)")
            });
            let num = |s: &str| -> i64 {
                s.parse().unwrap_or_else(|_| {
                    panic!("{dockerfile}: target {name}: USER {user} is not numeric")
                })
            };
            (name.clone(), (num(uid), num(gid)))
        })
        .collect();
    assert!(
        !images.is_empty(),
        "{dockerfile}: no stage has an ENTRYPOINT"
    );
    images
}

impl Rules {
    fn new() -> Rules {
        // deploy/build-offline-image.sh --target names deploy/Dockerfile's targets.
        let images = image_users("deploy/Dockerfile");
        assert_eq!(
            image_users("deploy/Dockerfile.offline"),
            images,
            "deploy/Dockerfile and deploy/Dockerfile.offline differ in their images or users"
        );
        let user = images[0].1;
        assert!(
            images.iter().all(|(_, u)| *u == user),
            "coord's images run as different users: {images:?}"
        );
        for target in ["coordinator", "coord-proxy"] {
            assert!(
                images.iter().any(|(name, _)| name == target),
                "deploy/Dockerfile has no target {target}: {images:?}"
            );
        }
        Rules {
            version: workspace_version(),
            user,
        }
    }
}

/// Every YAML document of `text`, empty ones left out.
fn documents(origin: &str, text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{origin}: not YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read deploy/k8s") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    out.sort();
}

fn relative(path: &Path) -> String {
    path.strip_prefix(workspace())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn is_kustomization(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n == "kustomization.yaml" || n == "kustomization.yml")
}

/// Files the kustomizations apply as patches: partial objects, checked once rendered.
fn patch_files(kustomizations: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for k in kustomizations {
        let text = std::fs::read_to_string(k).expect("kustomization");
        for doc in documents(&relative(k), &text) {
            let dir = k.parent().expect("dir");
            for p in seq(&doc, &["patches"]) {
                if let Some(path) = p.get("path").and_then(Value::as_str) {
                    out.push(dir.join(path));
                }
            }
            for p in seq(&doc, &["patchesStrategicMerge"]) {
                if let Some(path) = p.as_str() {
                    out.push(dir.join(path));
                }
            }
        }
    }
    out
}

fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

fn manifests() -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut files = Vec::new();
    yaml_files(&workspace().join("deploy/k8s"), &mut files);
    files.into_iter().partition(|f| is_kustomization(f))
}

#[test]
fn manifests_pass_the_restricted_standard() {
    let rules = Rules::new();
    let (kustomizations, files) = manifests();
    let patches = patch_files(&kustomizations);
    let mut problems = Vec::new();
    let mut kinds = Vec::new();
    for f in files.iter().filter(|f| !patches.contains(f)) {
        let origin = relative(f);
        let docs = documents(&origin, &std::fs::read_to_string(f).expect("manifest"));
        kinds.extend(
            docs.iter()
                .filter_map(|d| text(d, &["kind"]))
                .map(String::from),
        );
        problems.extend(check_objects(&origin, &docs, &rules));
    }
    // Not vacuous: the ensemble and the training Job are among what was checked.
    for kind in ["StatefulSet", "Job"] {
        assert!(
            kinds.iter().any(|k| k == kind),
            "no {kind} found under deploy/k8s"
        );
    }
    assert_none(problems);
}

#[test]
fn kustomizations_name_files_that_exist_and_render() {
    let rules = Rules::new();
    let (kustomizations, _) = manifests();
    assert!(
        !kustomizations.is_empty(),
        "no kustomization under deploy/k8s"
    );
    let mut problems = Vec::new();
    for k in &kustomizations {
        let origin = relative(k);
        let dir = k.parent().expect("dir");
        let text = std::fs::read_to_string(k).expect("kustomization");
        for doc in documents(&origin, &text) {
            let named = seq(&doc, &["resources"])
                .iter()
                .filter_map(Value::as_str)
                .chain(
                    seq(&doc, &["patches"])
                        .iter()
                        .filter_map(|p| p.get("path").and_then(Value::as_str)),
                );
            for r in named {
                let path = dir.join(r);
                let ok = if path.is_dir() {
                    path.join("kustomization.yaml").is_file()
                } else {
                    path.is_file()
                };
                if !ok {
                    problems.push(format!(
                        "{origin}: {r}: no such file, or a directory without kustomization.yaml"
                    ));
                }
            }
        }
    }
    assert_none(std::mem::take(&mut problems));

    let kubectl = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !kubectl {
        eprintln!("kubectl is not installed: the kustomizations are not rendered (skipped)");
        return;
    }
    for k in &kustomizations {
        let dir = k.parent().expect("dir");
        let origin = format!("kubectl kustomize {}", relative(dir));
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(dir)
            .output()
            .expect("run kubectl");
        if !out.status.success() {
            problems.push(format!(
                "{origin} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
            continue;
        }
        let docs = documents(&origin, &String::from_utf8_lossy(&out.stdout));
        eprintln!("{origin}: {} objects", docs.len());
        problems.extend(check_objects(&origin, &docs, &rules));
    }
    assert_none(problems);
}

/// The training Job is the example users copy: it must exist and have the sidecar's shape, not
/// merely pass the general checks.
#[test]
fn the_training_job_runs_coord_proxy_as_a_native_sidecar() {
    let path = workspace().join("deploy/k8s/tls/training-job.yaml");
    let origin = relative(&path);
    let docs = documents(
        &origin,
        &std::fs::read_to_string(&path).expect("training job"),
    );
    let jobs: Vec<&Value> = docs
        .iter()
        .filter(|d| text(d, &["kind"]) == Some("Job"))
        .collect();
    assert_eq!(jobs.len(), 1, "{origin}: want exactly one Job");
    let spec = at(jobs[0], &["spec", "template", "spec"]).expect("pod template");
    let sidecars: Vec<&Value> = seq(spec, &["initContainers"])
        .iter()
        .filter(|c| runs_proxy(c) && text(c, &["restartPolicy"]) == Some("Always"))
        .collect();
    assert_eq!(
        sidecars.len(),
        1,
        "{origin}: want one coord-proxy init container with restartPolicy: Always"
    );
    assert!(
        !seq(spec, &["containers"]).iter().any(runs_proxy),
        "{origin}: coord-proxy also runs as an ordinary container"
    );
    assert_none(check_objects(&origin, &docs, &Rules::new()));
}

/// The checks find what is wrong, and say where.
#[test]
fn the_checks_name_the_field_that_is_wrong() {
    let broken = r#"
apiVersion: batch/v1
kind: Job
metadata: {name: bad}
spec:
  template:
    spec:
      restartPolicy: Always
      securityContext: {runAsUser: 0}
      volumes:
        - {name: host, hostPath: {path: /}}
      containers:
        - name: trainer
          image: busybox:latest
          securityContext: {allowPrivilegeEscalation: true}
        - name: proxy
          image: coord:0.0.1
          command: [coord-proxy, --listen, "0.0.0.0:7200"]
          resources:
            requests: {cpu: 50m, memory: 1Gi}
            limits: {cpu: 500m, memory: 512Mi}
"#;
    let docs = documents("broken.yaml", broken);
    let problems = check_objects("broken.yaml", &docs, &Rules::new());
    let report = problems.join("\n");
    for want in [
        "broken.yaml: Job/bad: restartPolicy:",
        "Job/bad: volumes[host]:",
        "Job/bad: enableServiceLinks:",
        "Job/bad: containers[proxy]: coord-proxy must be a native sidecar",
        "Job/bad: containers[proxy].startupProbe:",
        "Job/bad: containers[proxy].command: --listen",
        "Job/bad: containers[trainer].securityContext.runAsNonRoot:",
        "Job/bad: containers[trainer].securityContext.runAsUser: is Some(0)",
        "Job/bad: containers[trainer].securityContext.seccompProfile.type:",
        "Job/bad: containers[trainer].securityContext.allowPrivilegeEscalation:",
        "Job/bad: containers[trainer].securityContext.readOnlyRootFilesystem:",
        "Job/bad: containers[trainer].securityContext.capabilities.drop:",
        "Job/bad: containers[trainer].image: \"busybox:latest\"",
        "Job/bad: containers[trainer].resources.limits.memory:",
        "Job/bad: containers[proxy].image: \"coord:0.0.1\": coord's image is tagged",
        "Job/bad: containers[proxy].image: \"coord:0.0.1\": coord-proxy runs from the image coord-proxy",
        "Job/bad: containers[proxy].resources.limits.memory: is below the request",
    ] {
        assert!(
            report.contains(want),
            "no problem reported as {want:?}; reported:\n{report}"
        );
    }
}

#[test]
fn dockerignore_keeps_the_build_context_to_the_sources() {
    let text = std::fs::read_to_string(workspace().join(".dockerignore")).expect(".dockerignore");
    let patterns: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.trim_end_matches('/'))
        .collect();
    for must in ["target", ".git"] {
        assert!(
            patterns.contains(&must),
            ".dockerignore does not exclude {must}/"
        );
    }
    // deploy/Dockerfile copies the workspace and builds it: cargo needs every member.
    let cargo = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    let members = cargo
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = "))
        .expect("workspace members");
    let needed = members
        .trim_matches(['[', ']'])
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .chain(["Cargo.toml", "Cargo.lock"]);
    for path in needed {
        assert!(
            !patterns
                .iter()
                .any(|p| *p == path || *p == "*" || *p == "**"),
            ".dockerignore excludes {path}, which the image build needs"
        );
    }
}

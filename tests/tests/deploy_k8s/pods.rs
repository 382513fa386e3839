//! The rules a pod template of `deploy/k8s` is held to: the "restricted" Pod Security Standard
//! (non-root, no privilege escalation, no capabilities, a seccomp profile, a read-only root
//! filesystem, allowed volume types only) and this project's own (pinned images, requests and
//! limits, the image's user, a memory limit that fits the quota, graceful termination for a
//! leader handoff, `coord-proxy` as a Job's native sidecar from its own image). Each problem names
//! the field.

use serde_yaml::Value;

/// What the checks hold the manifests to.
pub struct Rules {
    pub version: String,
    /// The image's uid and gid.
    pub user: (i64, i64),
}

pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

pub fn seq<'a>(v: &'a Value, path: &[&str]) -> &'a [Value] {
    at(v, path)
        .and_then(Value::as_sequence)
        .map_or(&[], Vec::as_slice)
}

pub fn text<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

/// A Kubernetes quantity (`512Mi`, `2Gi`, `500m`, `2`) as a number.
fn quantity(q: &Value) -> Option<f64> {
    let s = match q {
        Value::Number(n) => return n.as_f64(),
        Value::String(s) => s.as_str(),
        _ => return None,
    };
    const SUFFIXES: [(&str, f64); 9] = [
        ("Ki", 1024.0),
        ("Mi", 1048576.0),
        ("Gi", 1073741824.0),
        ("Ti", 1099511627776.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("m", 1e-3),
    ];
    for (suffix, factor) in SUFFIXES {
        if let Some(n) = s.strip_suffix(suffix) {
            return n.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    s.parse().ok()
}

/// A tag that names one release: a full version (`1.36.1`, `v0.1.0-rc1`), not `latest`,
/// `stable` or a bare major version that moves.
fn is_full_version(tag: &str) -> bool {
    let core = tag.trim_start_matches('v');
    let core = core.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() >= 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The repository's last path segment and the tag of an image reference (`None`: no tag, or
/// pinned by digest).
fn image_parts(image: &str) -> (&str, Option<&str>, bool) {
    let (name, digest) = match image.split_once('@') {
        Some((n, _)) => (n, true),
        None => (image, false),
    };
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':') {
        Some((repo, tag)) => (repo, Some(tag), digest),
        None => (last, None, digest),
    }
}

/// coord's images (deploy/Dockerfile's targets), by the repository's last path segment: the
/// replica's (`coordinator`, `coordctl`) and the sidecar's (`coord-proxy` alone).
const COORD_IMAGE: &str = "coord";
const PROXY_IMAGE: &str = "coord-proxy";

fn is_coord_image(repo: &str) -> bool {
    repo == COORD_IMAGE || repo == PROXY_IMAGE
}

/// The pod spec of an object that makes pods, and whether the pods belong to a Job.
fn pod_spec(obj: &Value) -> Option<(&Value, bool)> {
    match text(obj, &["kind"])? {
        "Pod" => Some((obj.get("spec")?, false)),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "ReplicationController" => {
            Some((at(obj, &["spec", "template", "spec"])?, false))
        }
        "Job" => Some((at(obj, &["spec", "template", "spec"])?, true)),
        "CronJob" => Some((
            at(obj, &["spec", "jobTemplate", "spec", "template", "spec"])?,
            true,
        )),
        _ => None,
    }
}

/// Volume types the restricted standard allows.
const RESTRICTED_VOLUMES: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Runs `coordinator` (directly, or through the start script).
fn runs_coordinator(c: &Value) -> bool {
    let words: Vec<&str> = seq(c, &["command"])
        .iter()
        .chain(seq(c, &["args"]))
        .filter_map(Value::as_str)
        .collect();
    words.first() == Some(&"coordinator") || words.iter().any(|w| w.contains("exec coordinator"))
}

pub fn runs_proxy(c: &Value) -> bool {
    seq(c, &["command"]).first().and_then(Value::as_str) == Some("coord-proxy")
}

fn env_value<'a>(c: &'a Value, name: &str) -> Option<&'a str> {
    seq(c, &["env"])
        .iter()
        .find(|e| text(e, &["name"]) == Some(name))
        .and_then(|e| text(e, &["value"]))
}

/// The default `--quota-bytes`.
const DEFAULT_QUOTA_BYTES: f64 = 2.0 * 1073741824.0;

/// Checks every object of `docs` that makes pods; returns the problems found, each naming
/// `origin`, the object and the field.
pub fn check_objects(origin: &str, docs: &[Value], rules: &Rules) -> Vec<String> {
    let mut problems = Vec::new();
    for obj in docs {
        let kind = text(obj, &["kind"]).unwrap_or("?");
        let name = text(obj, &["metadata", "name"]).unwrap_or("?");
        if text(obj, &["apiVersion"]).is_none() || kind == "?" || name == "?" {
            problems.push(format!(
                "{origin}: {kind}/{name}: apiVersion, kind and metadata.name are required"
            ));
        }
        if let Some((spec, in_job)) = pod_spec(obj) {
            let mut p = |field: &str, what: String| {
                problems.push(format!("{origin}: {kind}/{name}: {field}: {what}"))
            };
            check_pod(spec, in_job, rules, &mut p);
        }
    }
    problems
}

fn check_pod(spec: &Value, in_job: bool, rules: &Rules, p: &mut impl FnMut(&str, String)) {
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec.get(field).and_then(Value::as_bool) == Some(true) {
            p(field, "must not be true".into());
        }
    }
    for v in seq(spec, &["volumes"]) {
        let vname = text(v, &["name"]).unwrap_or("?");
        let allowed = v.as_mapping().is_some_and(|m| {
            m.keys()
                .filter_map(Value::as_str)
                .filter(|k| *k != "name")
                .all(|k| RESTRICTED_VOLUMES.contains(&k))
        });
        if !allowed {
            p(
                &format!("volumes[{vname}]"),
                format!("only {RESTRICTED_VOLUMES:?} volumes are allowed"),
            );
        }
    }
    let pod_sc = spec.get("securityContext");
    let all: Vec<(&str, &Value)> = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|list| seq(spec, &[list]).iter().map(move |c| (*list, c)))
        .collect();
    if all.is_empty() {
        p("containers", "no containers".into());
    }
    let coord_image = all
        .iter()
        .any(|(_, c)| text(c, &["image"]).is_some_and(|i| is_coord_image(image_parts(i).0)));
    if coord_image {
        // The Service `coord` would inject COORD_SERVICE_HOST, COORD_PORT, ..., which coord's
        // binaries would read as settings.
        if spec.get("enableServiceLinks").and_then(Value::as_bool) != Some(false) {
            p(
                "enableServiceLinks",
                "must be false in pods of coord's image".into(),
            );
        }
        let fs_group = pod_sc
            .and_then(|s| s.get("fsGroup"))
            .and_then(Value::as_i64);
        if fs_group != Some(rules.user.1) {
            p(
                "securityContext.fsGroup",
                format!(
                    "is {fs_group:?}; the image's group {} must own the data volume and read the certificates",
                    rules.user.1
                ),
            );
        }
    }
    if all.iter().any(|(_, c)| runs_coordinator(c)) {
        let grace = spec
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64);
        if grace.is_none_or(|g| g < 30) {
            p(
                "terminationGracePeriodSeconds",
                format!("is {grace:?}; a leader's handoff and drain need 30 s"),
            );
        }
    }
    if in_job {
        check_job_pod(spec, &all, p);
    }
    for (list, c) in &all {
        let cname = text(c, &["name"]).unwrap_or("?");
        let field = |f: &str| format!("{list}[{cname}].{f}");
        check_container(c, pod_sc, rules, &mut |f, what| p(&field(f), what));
    }
}

/// A Job's pod: it completes when its ordinary containers have exited, so `coord-proxy` (which
/// never exits) must be a native sidecar that the trainer waits for.
fn check_job_pod(spec: &Value, all: &[(&str, &Value)], p: &mut impl FnMut(&str, String)) {
    let policy = text(spec, &["restartPolicy"]);
    if !matches!(policy, Some("Never" | "OnFailure")) {
        p(
            "restartPolicy",
            format!("is {policy:?}; a Job's pod needs Never or OnFailure"),
        );
    }
    if seq(spec, &["containers"]).is_empty() {
        p("containers", "a Job needs the trainer container".into());
    }
    for (list, c) in all.iter().filter(|(_, c)| runs_proxy(c)) {
        let cname = text(c, &["name"]).unwrap_or("?");
        if *list != "initContainers" || text(c, &["restartPolicy"]) != Some("Always") {
            p(
                &format!("{list}[{cname}]"),
                "coord-proxy must be a native sidecar (an init container with restartPolicy: Always), or the Job never completes".into(),
            );
        }
        if c.get("startupProbe").is_none() {
            p(
                &format!("{list}[{cname}].startupProbe"),
                "missing: the trainer should start once the proxy listens".into(),
            );
        }
        let words: Vec<&str> = seq(c, &["command"])
            .iter()
            .chain(seq(c, &["args"]))
            .filter_map(Value::as_str)
            .collect();
        let listen = words
            .iter()
            .position(|w| *w == "--listen")
            .and_then(|i| words.get(i + 1));
        if !listen.is_some_and(|l| l.starts_with("127.0.0.1:")) {
            p(
                &format!("{list}[{cname}].command"),
                format!(
                    "--listen is {listen:?}; the proxy acts with the task's certificate, so it listens on 127.0.0.1 only"
                ),
            );
        }
    }
}

fn check_container(
    c: &Value,
    pod_sc: Option<&Value>,
    rules: &Rules,
    p: &mut impl FnMut(&str, String),
) {
    let sc = c.get("securityContext");
    // Fields a container inherits from the pod when it does not set them.
    let effective = |path: &[&str]| {
        sc.and_then(|s| at(s, path))
            .or_else(|| pod_sc.and_then(|s| at(s, path)))
    };
    if effective(&["runAsNonRoot"]).and_then(Value::as_bool) != Some(true) {
        p("securityContext.runAsNonRoot", "must be true".into());
    }
    let image = text(c, &["image"]).unwrap_or("");
    let (repo, tag, digest) = image_parts(image);
    for (field, want) in [("runAsUser", rules.user.0), ("runAsGroup", rules.user.1)] {
        let id = effective(&[field]).and_then(Value::as_i64);
        match id {
            None | Some(0) => p(
                &format!("securityContext.{field}"),
                format!("is {id:?}; must be set and non-zero"),
            ),
            Some(id) if is_coord_image(repo) && id != want => p(
                &format!("securityContext.{field}"),
                format!("is {id}; coord's image runs as {want} (deploy/Dockerfile's USER)"),
            ),
            _ => {}
        }
    }
    let seccomp = effective(&["seccompProfile", "type"]).and_then(Value::as_str);
    if !matches!(seccomp, Some("RuntimeDefault" | "Localhost")) {
        p(
            "securityContext.seccompProfile.type",
            format!("is {seccomp:?}; must be RuntimeDefault or Localhost"),
        );
    }
    let own = |path: &[&str]| sc.and_then(|s| at(s, path));
    if own(&["allowPrivilegeEscalation"]).and_then(Value::as_bool) != Some(false) {
        p(
            "securityContext.allowPrivilegeEscalation",
            "must be false".into(),
        );
    }
    if own(&["privileged"]).and_then(Value::as_bool) == Some(true) {
        p("securityContext.privileged", "must not be true".into());
    }
    if own(&["readOnlyRootFilesystem"]).and_then(Value::as_bool) != Some(true) {
        p(
            "securityContext.readOnlyRootFilesystem",
            "must be true (mount an emptyDir where the process writes)".into(),
        );
    }
    let drop = own(&["capabilities", "drop"])
        .and_then(Value::as_sequence)
        .is_some_and(|d| d.iter().any(|c| c.as_str() == Some("ALL")));
    if !drop {
        p("securityContext.capabilities.drop", "must hold ALL".into());
    }
    for cap in own(&["capabilities", "add"])
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
    {
        if cap.as_str() != Some("NET_BIND_SERVICE") {
            p(
                "securityContext.capabilities.add",
                format!("{cap:?}: only NET_BIND_SERVICE is allowed"),
            );
        }
    }
    // Each binary from the image built for it: the sidecar's image holds coord-proxy alone, and
    // coord's holds no coord-proxy.
    let wanted = if runs_proxy(c) {
        Some(("coord-proxy", PROXY_IMAGE))
    } else if runs_coordinator(c) {
        Some(("coordinator", COORD_IMAGE))
    } else {
        None
    };
    if let Some((program, want)) = wanted.filter(|(_, want)| repo != *want) {
        p(
            "image",
            format!(
                "{image:?}: {program} runs from the image {want} (a target of deploy/Dockerfile)"
            ),
        );
    }
    for port in seq(c, &["ports"]) {
        if port.get("hostPort").is_some() {
            p("ports", "hostPort is not allowed".into());
        }
    }
    if !digest {
        match tag {
            None => p("image", format!("{image:?} has no tag")),
            Some(t) if is_coord_image(repo) && t != rules.version => p(
                "image",
                format!(
                    "{image:?}: coord's image is tagged with the workspace version, {}",
                    rules.version
                ),
            ),
            Some(t) if !is_full_version(t) => p(
                "image",
                format!("{image:?}: pin a full version (x.y.z) or a digest"),
            ),
            _ => {}
        }
    }
    for section in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            if at(c, &["resources", section, resource])
                .and_then(quantity)
                .is_none()
            {
                p(
                    &format!("resources.{section}.{resource}"),
                    "missing or not a quantity".into(),
                );
            }
        }
    }
    let memory = |section| at(c, &["resources", section, "memory"]).and_then(quantity);
    if let (Some(req), Some(lim)) = (memory("requests"), memory("limits")) {
        if lim < req {
            p("resources.limits.memory", "is below the request".into());
        }
    }
    if runs_coordinator(c) {
        // The state, a snapshot's encoded copy and, on a follower installing one, the state it
        // replaces; plus 1 GiB for parked calls, watch history, recent entries and the process.
        let quota = env_value(c, "COORD_QUOTA_BYTES")
            .map(|q| q.parse::<f64>().expect("COORD_QUOTA_BYTES is a number"))
            .unwrap_or(DEFAULT_QUOTA_BYTES);
        let need = 3.0 * quota + 1073741824.0;
        if memory("limits").is_some_and(|lim| lim < need) {
            p(
                "resources.limits.memory",
                format!(
                    "is below 3 x the quota ({quota} bytes) + 1 GiB = {need} bytes; lower COORD_QUOTA_BYTES or raise the limit"
                ),
            );
        }
    }
}

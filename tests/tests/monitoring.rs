//! The monitoring assets: `deploy/prometheus` (alerting rules, their unit tests, the scrape
//! config) and `deploy/grafana/coord.json` (the dashboard).
//!
//! Without any tool: every alert carries a severity, a summary and a description and is unit
//! tested both firing and not firing; the dashboard is importable (its data source a variable);
//! and every PromQL expression of both selects only metrics the replicas export ([`METRICS`]), so
//! a misspelt name fails here rather than staying silent on a real Prometheus. With `promtool`
//! (Debian's `prometheus` package, installed here when missing and apt-get can run; skipped,
//! saying why, otherwise): `promtool check rules`, `promtool test rules`, `promtool check config`,
//! and the dashboard's expressions through Prometheus' own parser.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_yaml::Value;

/// What the replicas' `/metrics` serves that the alerts and the dashboard rely on, plus
/// Prometheus' own `up`. Histograms are named without their `_bucket`/`_sum`/`_count` suffixes.
const METRICS: [&str; 23] = [
    "coord_has_leader",
    "coord_raft_is_leader",
    "coord_raft_term",
    "coord_raft_last_log_index",
    "coord_raft_last_applied_index",
    "coord_raft_leader_changes_total",
    "coord_proposal_queue_depth",
    "coord_proposal_stalled_seconds",
    "coord_proposal_abandoned_leader_lost_total",
    "coord_proposal_abandoned_stuck_total",
    "coord_log_sync_seconds",
    "coord_quota_alarm",
    "coord_state_bytes",
    "coord_quota_bytes",
    "coord_tasks",
    "coord_rpc_duration_seconds",
    "coord_parked_slots_used",
    "coord_parked_slots_max",
    "coord_build_info",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_open_fds",
    "up",
];

const HISTOGRAMS: [&str; 2] = ["coord_log_sync_seconds", "coord_rpc_duration_seconds"];

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .join("deploy")
        .join(path)
}

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(deploy(path)).expect("read");
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("deploy/{path}: {e}"))
}

fn dashboard() -> serde_json::Value {
    let text = std::fs::read_to_string(deploy("grafana/coord.json")).expect("read dashboard");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("deploy/grafana/coord.json: {e}"))
}

/// Skips a string literal starting at `i`; returns the index after it.
fn skip_string(chars: &[char], i: usize) -> usize {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() && chars[j] != quote {
        j += if chars[j] == '\\' && quote != '`' {
            2
        } else {
            1
        };
    }
    j + 1
}

/// Skips to just after the `close` that ends the bracket opened at `i`, past strings inside.
fn skip_bracket(chars: &[char], i: usize, close: char) -> usize {
    let mut j = i + 1;
    while j < chars.len() && chars[j] != close {
        j = if matches!(chars[j], '"' | '\'' | '`') {
            skip_string(chars, j)
        } else {
            j + 1
        };
    }
    j + 1
}

/// The metric names a PromQL expression selects: its identifiers that are not functions,
/// aggregations or keywords, nor label names (in `{...}`, `by (...)`, `on (...)`, ...), nor
/// inside strings, ranges or Grafana variables.
fn metric_names(expr: &str) -> Vec<String> {
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: [&str; 20] = [
        "offset",
        "bool",
        "and",
        "or",
        "unless",
        "inf",
        "nan",
        "group_left",
        "group_right",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&chars, i);
        } else if c == '{' {
            i = skip_bracket(&chars, i, '}');
        } else if c == '[' {
            i = skip_bracket(&chars, i, ']');
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            // A Grafana variable, a number or a duration.
            i += 1;
            while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if LABEL_LISTS.contains(&word.as_str()) && call {
                i = skip_bracket(&chars, next, ')');
            } else if !call && !KEYWORDS.contains(&word.as_str()) {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// `name` as one of [`METRICS`] (a histogram's series by its base name), if it is one.
fn known(name: &str) -> Option<&'static str> {
    let base = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .filter(|b| HISTOGRAMS.contains(b));
    METRICS
        .iter()
        .find(|m| **m == name || Some(**m) == base)
        .copied()
}

/// Every alerting rule of alerts.yaml.
fn alert_rules() -> Vec<Value> {
    let rules = yaml("prometheus/alerts.yaml");
    let groups = rules["groups"].as_sequence().expect("groups").clone();
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Every query of the dashboard: (panel title, expression), rows' nested panels included.
fn dashboard_queries(d: &serde_json::Value) -> Vec<(String, String)> {
    fn walk(panels: &[serde_json::Value], out: &mut Vec<(String, String)>) {
        for p in panels {
            if let Some(nested) = p["panels"].as_array() {
                walk(nested, out);
            }
            for t in p["targets"].as_array().into_iter().flatten() {
                let title = p["title"].as_str().unwrap_or("?").to_string();
                out.push((title, t["expr"].as_str().unwrap_or("").to_string()));
            }
        }
    }
    let mut out = Vec::new();
    walk(d["panels"].as_array().expect("panels"), &mut out);
    out
}

#[test]
fn metric_names_are_found_in_promql() {
    let names = metric_names(
        r#"max by (job) (a_b{job="x{y}", instance=~"$instance"}) - on (job) group_right c:d
           + histogram_quantile(0.99, sum by (le) (rate(e_bucket[$__rate_interval] offset 5m)))
           > bool 1e3 and count without (q) (f) unless topk(3, g)"#,
    );
    assert_eq!(names, ["a_b", "c:d", "e_bucket", "f", "g"]);
    assert_eq!(
        known("coord_log_sync_seconds_bucket"),
        Some("coord_log_sync_seconds")
    );
    assert_eq!(known("coord_quota_alarm_count"), None);
    assert_eq!(known("coord_has_leaders"), None);
}

#[test]
fn every_alert_is_described_and_tested_firing_and_not() {
    let tests = yaml("prometheus/alerts_test.yaml");
    let cases: Vec<&Value> = tests["tests"]
        .as_sequence()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().into_iter().flatten())
        .collect();
    let mut problems = Vec::new();
    let rules = alert_rules();
    assert!(!rules.is_empty(), "alerts.yaml holds no alert");
    for r in &rules {
        let name = r["alert"].as_str().expect("alert name");
        let severity = r["labels"]["severity"].as_str();
        if !matches!(severity, Some("critical" | "warning")) {
            problems.push(format!(
                "{name}: labels.severity is {severity:?}, want critical or warning"
            ));
        }
        for a in ["summary", "description"] {
            if r["annotations"][a].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{name}: annotations.{a} is missing"));
            }
        }
        let fires = |f: bool| {
            cases.iter().any(|c| {
                c["alertname"].as_str() == Some(name)
                    && c["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()) == f
            })
        };
        if !fires(true) {
            problems.push(format!("{name}: alerts_test.yaml never expects it to fire"));
        }
        if !fires(false) {
            problems.push(format!(
                "{name}: alerts_test.yaml never expects it to stay silent"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "alerts.yaml:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn alerts_and_dashboard_select_only_exported_metrics() {
    let mut problems = Vec::new();
    for r in alert_rules() {
        let name = r["alert"].as_str().unwrap_or("?");
        for m in metric_names(r["expr"].as_str().unwrap_or("")) {
            if known(&m).is_none() {
                problems.push(format!("alerts.yaml: {name}: unknown metric {m}"));
            }
        }
    }
    let mut shown = Vec::new();
    for (title, expr) in dashboard_queries(&dashboard()) {
        for m in metric_names(&expr) {
            match known(&m) {
                Some(k) => shown.push(k),
                None => problems.push(format!("coord.json: panel {title:?}: unknown metric {m}")),
            }
        }
    }
    for m in METRICS {
        if !shown.contains(&m) {
            problems.push(format!("coord.json: no panel shows {m}"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn dashboard_is_importable_with_any_prometheus() {
    let d = dashboard();
    let mut problems = Vec::new();
    for field in ["title", "uid"] {
        if d[field].as_str().is_none_or(str::is_empty) {
            problems.push(format!("{field} is missing"));
        }
    }
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    let ds = vars.iter().find(|v| v["name"] == "datasource");
    if !ds.is_some_and(|v| v["type"] == "datasource" && v["query"] == "prometheus") {
        problems.push("no templating variable `datasource` of type datasource (prometheus)".into());
    }
    let mut ids = Vec::new();
    let mut panels: Vec<&serde_json::Value> = Vec::new();
    for p in d["panels"].as_array().expect("panels") {
        panels.push(p);
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        let id = p["id"].as_u64();
        if id.is_none() || ids.contains(&id) {
            problems.push(format!("panel {title:?}: id {id:?} missing or repeated"));
        }
        ids.push(id);
        let g = &p["gridPos"];
        let (x, w) = (g["x"].as_u64(), g["w"].as_u64());
        if !matches!((x, w), (Some(x), Some(w)) if w > 0 && x + w <= 24)
            || g["y"].as_u64().is_none()
        {
            problems.push(format!(
                "panel {title:?}: gridPos {g} is off the 24-column grid"
            ));
        }
        if p["type"] == "row" {
            continue;
        }
        // The data source is the variable, never one Grafana's uid: imports work anywhere.
        let sources = std::iter::once(&p["datasource"]).chain(
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| &t["datasource"]),
        );
        for s in sources {
            if s["uid"] != "${datasource}" {
                problems.push(format!(
                    "panel {title:?}: data source {s}, want uid ${{datasource}}"
                ));
            }
        }
        let targets = p["targets"].as_array().map_or(0, Vec::len);
        let empty = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["expr"].as_str().is_none_or(|e| e.trim().is_empty()));
        if targets == 0 || empty {
            problems.push(format!("panel {title:?}: a query is missing or empty"));
        }
    }
    assert!(
        problems.is_empty(),
        "coord.json:\n  {}",
        problems.join("\n  ")
    );
}

/// `promtool`, found on the PATH or installed from Debian's `prometheus` package (which ships
/// it; the package also brings the Prometheus server, which Debian starts where systemd runs).
/// Once per test process, so parallel tests do not race apt-get. `Err` says why there is none.
fn promtool() -> Result<&'static str, String> {
    static FOUND: OnceLock<Result<String, String>> = OnceLock::new();
    fn version() -> Option<String> {
        let out = Command::new("promtool").arg("--version").output().ok()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out.status
            .success()
            .then(|| text.lines().next().unwrap_or("").to_string())
    }
    FOUND
        .get_or_init(|| {
            if let Some(v) = version() {
                return Ok(v);
            }
            eprintln!("promtool not found; installing Debian's prometheus (apt-get install -y prometheus)");
            let install = Command::new("apt-get")
                .args(["install", "-y", "--no-install-recommends", "prometheus"])
                .env("DEBIAN_FRONTEND", "noninteractive")
                .output();
            match install {
                Err(e) => Err(format!("promtool is not installed, and apt-get cannot run: {e}")),
                Ok(o) if !o.status.success() => Err(format!(
                    "promtool is not installed, and apt-get install prometheus failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Ok(_) => version()
                    .ok_or_else(|| "prometheus was installed but promtool does not run".into()),
            }
        })
        .as_deref()
        .map_err(Clone::clone)
}

/// Runs promtool; panics with its output if it fails.
fn run_promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}:\n{text}", args.join(" "));
    eprintln!("promtool {}: {}", args.join(" "), text.trim());
}

#[test]
fn promtool_accepts_and_tests_the_rules_and_the_config() {
    let v = match promtool() {
        Ok(v) => v,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    eprintln!("using {v}");
    let path = |p: &str| deploy(p).display().to_string();
    run_promtool(&["check", "rules", &path("prometheus/alerts.yaml")]);
    run_promtool(&["test", "rules", &path("prometheus/alerts_test.yaml")]);
    run_promtool(&["check", "config", &path("prometheus/prometheus.yaml")]);
}

/// The dashboard's queries, with Grafana's variables filled in, as recording rules: Prometheus'
/// own parser then checks every one.
#[test]
fn promtool_parses_the_dashboard_queries() {
    if let Err(why) = promtool() {
        return eprintln!("skipped: {why}");
    }
    let mut rules = Vec::new();
    for (i, (title, expr)) in dashboard_queries(&dashboard()).into_iter().enumerate() {
        let filled = expr
            .replace("$__rate_interval", "5m")
            .replace("$__interval", "1m")
            .replace("$job", "coord")
            .replace("$instance", ".*");
        assert!(
            !filled.contains('$'),
            "panel {title:?}: a variable the test does not know: {expr}"
        );
        let mut rule = serde_yaml::Mapping::new();
        rule.insert("record".into(), format!("dashboard:query_{i}").into());
        rule.insert("expr".into(), filled.into());
        rules.push(Value::Mapping(rule));
    }
    let mut group = serde_yaml::Mapping::new();
    group.insert("name".into(), "dashboard".into());
    group.insert("rules".into(), Value::Sequence(rules));
    let mut file = serde_yaml::Mapping::new();
    file.insert(
        "groups".into(),
        Value::Sequence(vec![Value::Mapping(group)]),
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dashboard_queries.yaml");
    std::fs::write(&path, serde_yaml::to_string(&file).expect("yaml")).expect("write");
    run_promtool(&["check", "rules", &path.display().to_string()]);
}

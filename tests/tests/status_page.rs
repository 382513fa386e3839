//! The status page in a real headless browser (Debian's `chromium`; the test installs it with
//! apt-get where it can, and skips saying why where it cannot): the replicas, the task grid
//! coloured by state and the open barriers with the tasks they wait for, as the page's own
//! script renders them from `/api/overview`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use coord_tests::{Cluster, ClusterOptions};

fn find_browser() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find_map(|b| {
            let out = Command::new("which").arg(b).output().ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
}

/// A headless browser, installed from Debian's archive if missing and possible.
fn browser() -> Result<PathBuf, String> {
    if let Some(b) = find_browser() {
        return Ok(b);
    }
    eprintln!("no chromium here: trying apt-get install chromium");
    let installed = Command::new("apt-get")
        .args(["install", "-y", "-q", "chromium"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdout(Stdio::null())
        .status();
    match installed {
        Ok(s) if s.success() => find_browser().ok_or("chromium installed but not found".into()),
        Ok(s) => Err(format!("apt-get install chromium failed ({s})")),
        Err(e) => Err(format!("no chromium, and apt-get cannot run: {e}")),
    }
}

fn worker(i: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: i,
        recoverable: false,
    }
}

/// The start tag of the element carrying `attr="value"`.
fn tag_with<'a>(dom: &'a str, attr: &str, value: &str) -> &'a str {
    let needle = format!("{attr}=\"{value}\"");
    let at = dom
        .find(&needle)
        .unwrap_or_else(|| panic!("no element with {needle} in the page:\n{dom}"));
    let start = dom[..at].rfind('<').expect("tag start");
    let end = at + dom[at..].find('>').expect("tag end");
    &dom[start..=end]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_shows_replicas_tasks_and_barriers() {
    let chromium = match browser() {
        Ok(b) => b,
        Err(why) => {
            eprintln!("SKIPPED status_page_shows_replicas_tasks_and_barriers: {why}");
            return;
        }
    };
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: ["--job", "worker=3", "--heartbeat-timeout-ms", "60000"]
            .map(String::from)
            .into(),
        ..ClusterOptions::default()
    });
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let client = CoordClient::new(ClientOptions::new(cluster.endpoints())).expect("client");
    // Task 0 connected and waiting at a barrier with task 2 (never registered); task 1 failed.
    client
        .register_task(&worker(0), 1)
        .await
        .expect("register 0");
    client
        .register_task(&worker(1), 2)
        .await
        .expect("register 1");
    client
        .report_error(&worker(1), 13, "out of memory")
        .await
        .expect("report");
    let waiting = {
        let c = client.clone();
        tokio::spawn(async move {
            c.barrier(
                "checkpoint",
                0,
                Duration::from_secs(600),
                &[worker(0), worker(2)],
                &worker(0),
            )
            .await
        })
    };
    let page = format!(
        "http://{}/",
        cluster.replica(cluster.other_than(leader)).http
    );
    let shot = cluster.root().join("status-page.png");
    let mut dom = String::new();
    // The page fills itself in from /api/overview; give it a few tries while the barrier parks.
    for _ in 0..20 {
        let out = Command::new(&chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--virtual-time-budget=5000",
                "--window-size=1100,700",
            ])
            .arg(format!("--screenshot={}", shot.display()))
            .arg("--dump-dom")
            .arg(&page)
            .stderr(Stdio::null())
            .output()
            .expect("run chromium");
        dom = String::from_utf8_lossy(&out.stdout).into_owned();
        // A loaded machine may be mid-election: wait for a page with a leader.
        if dom.contains("data-barrier=") && dom.contains("class=\"leader\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    waiting.abort();
    for (task, state) in [(0, "CONNECTED"), (1, "ERROR"), (2, "DISCONNECTED")] {
        let tag = tag_with(&dom, "data-task", &format!("/job:worker/task:{task}"));
        assert!(tag.contains(&format!("data-state=\"{state}\"")), "{tag}");
        assert!(tag.contains(&format!("class=\"task {state}\"")), "{tag}");
    }
    assert!(tag_with(&dom, "data-task", "/job:worker/task:1").contains("out of memory"));
    tag_with(&dom, "data-barrier", "checkpoint");
    tag_with(&dom, "data-missing", "/job:worker/replica:0/task:2");
    for id in 1..=3 {
        tag_with(&dom, "data-replica", &id.to_string());
    }
    // The leader's row stands out, and only it.
    let table = &dom[dom.find("<tbody>").unwrap_or(0)..dom.find("</tbody>").unwrap_or(0)];
    let rows: Vec<&str> = table.split("<tr ").skip(1).collect();
    let marked: Vec<&&str> = rows
        .iter()
        .filter(|r| r.contains("class=\"leader\""))
        .collect();
    assert_eq!(marked.len(), 1, "{table}");
    assert!(marked[0].contains("<td>Leader</td>"), "{table}");
    // The namespaces, and one opened: its own tasks.
    let mut options = ClientOptions::new(cluster.endpoints());
    options.namespace = Some("job-7".into());
    client
        .declare_namespace(coord_proto::coord::admin::DeclareNamespaceRequest {
            name: "job-7".into(),
            shape: Some(coord_proto::coord::admin::NamespaceShape {
                jobs: [("trainer".to_string(), 2)].into_iter().collect(),
                heartbeat_timeout_ms: 60_000,
                ..Default::default()
            }),
            limits: None,
        })
        .await
        .expect("declare");
    let in_ns = CoordClient::new(options).expect("client");
    let trainer = tf::CoordinatedTask {
        job_name: "trainer".into(),
        task_id: 1,
        recoverable: false,
    };
    in_ns
        .register_task(&trainer, 1)
        .await
        .expect("register in job-7");
    let page = format!("{page}?namespace=job-7");
    for _ in 0..20 {
        let out = Command::new(&chromium)
            .args(["--headless", "--no-sandbox", "--disable-gpu"])
            .arg("--virtual-time-budget=5000")
            .arg("--dump-dom")
            .arg(&page)
            .stderr(Stdio::null())
            .output()
            .expect("run chromium");
        dom = String::from_utf8_lossy(&out.stdout).into_owned();
        if dom.contains("data-task=\"/job:trainer/task:1\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tag_with(&dom, "data-namespace", "default");
    assert!(tag_with(&dom, "data-namespace", "job-7").contains("class=\"shown\""));
    let tag = tag_with(&dom, "data-task", "/job:trainer/task:1");
    assert!(tag.contains("data-state=\"CONNECTED\""), "{tag}");
    assert!(
        !dom.contains("data-task=\"/job:worker/task:0\""),
        "only job-7's tasks"
    );
    // Kept beside the build for a person to look at.
    let kept = coord_tests::cluster::profile_dir().join("status-page.png");
    if std::fs::copy(&shot, &kept).is_ok() {
        eprintln!("screenshot: {}", kept.display());
    }
}

//! `coord-demo`: a training job that survives the preemption of its chief.
//!
//! The supervisor ([`run_job`]) starts a 3-replica ensemble and N task processes (`coord-demo
//! task`, see [`task`]), then plays a [`Scenario`]: SIGTERM to the tasks to be preempted, `kill
//! -9` of the coordinator leader (the replica on the chief's host), restarts of whoever exited.
//! Every process prints timeline lines; the supervisor merges them (and returns them, for the
//! tests).
//!
//! - `ensemble`: the demo's 3 `coordinator` processes, which the supervisor kills and restarts
//!   (the shared [`crate::ensemble`] with the demo's flags).
//! - [`task`]: one task process: the step loop, preemption sync, checkpoints.

mod ensemble;
pub mod task;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::process::send_signal;
use ensemble::Ensemble;
use task::Timeline;

pub const JOB: &str = "worker";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// The chief (task 0) is preempted; the leader replica dies as the chief exits; the chief
    /// restarts and the job resumes.
    Chief,
    /// A notice arrives while the ensemble elects a new leader.
    Election,
    /// Two tasks are preempted at once.
    Two,
    /// A task dies (kill -9) before the sync barrier: the barrier fails, nobody hangs.
    Dies,
}

#[derive(Clone, Debug)]
pub struct JobOptions {
    pub tasks: usize,
    pub steps: i64,
    pub step_time: Duration,
    pub grace: Duration,
    pub scenario: Scenario,
    /// Print the timeline as it happens.
    pub echo: bool,
}

impl Default for JobOptions {
    fn default() -> Self {
        Self {
            tasks: 3,
            steps: 80,
            step_time: Duration::from_millis(100),
            grace: Duration::from_secs(20),
            scenario: Scenario::Chief,
            echo: true,
        }
    }
}

/// Everything that happened: the merged timeline and how each task process ended.
#[derive(Debug, Default)]
pub struct JobOutcome {
    pub lines: Vec<String>,
    /// (task, exit code) for every task process, in the order they exited.
    pub exits: Vec<(i32, Option<i32>)>,
}

impl JobOutcome {
    /// Timeline lines of `who` (e.g. "worker/0") containing `what`.
    pub fn said<'a>(&'a self, who: &str, what: &str) -> Vec<&'a str> {
        self.lines
            .iter()
            .filter(|l| line_is_from(l, who) && l.contains(what))
            .map(String::as_str)
            .collect()
    }

    /// The step number at the end of each of `who`'s lines containing `what`.
    pub fn steps(&self, who: &str, what: &str) -> Vec<i64> {
        self.said(who, what)
            .iter()
            .filter_map(|l| {
                let rest = &l[l.find(what)? + what.len()..];
                rest.split(|c: char| !c.is_ascii_digit())
                    .find(|s| !s.is_empty())?
                    .parse()
                    .ok()
            })
            .collect()
    }
}

fn line_is_from(line: &str, who: &str) -> bool {
    line.split_whitespace().nth(1) == Some(who)
}

/// The task processes and the lines they print.
struct Tasks {
    binary: PathBuf,
    endpoints: Vec<String>,
    options: JobOptions,
    checkpoint_dir: PathBuf,
    epoch_ms: u64,
    running: Vec<(i32, Child)>,
    lines: Arc<Mutex<Vec<String>>>,
    exits: Vec<(i32, Option<i32>)>,
}

impl Tasks {
    fn spawn(&mut self, id: i32) {
        let mut child = Command::new(&self.binary)
            .arg("task")
            .args(["--endpoints", &self.endpoints.join(",")])
            .args(["--task-id", &id.to_string()])
            .args(["--steps", &self.options.steps.to_string()])
            .args(["--step-ms", &self.options.step_time.as_millis().to_string()])
            .args(["--grace-ms", &self.options.grace.as_millis().to_string()])
            .arg("--checkpoint-dir")
            .arg(&self.checkpoint_dir)
            .args(["--epoch-ms", &self.epoch_ms.to_string()])
            // The timeline says what matters; COORD_DEMO_LOG turns the tasks' logs on.
            .env(
                "RUST_LOG",
                std::env::var("COORD_DEMO_LOG").unwrap_or_else(|_| "off".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a demo task");
        if let Some(out) = child.stdout.take() {
            let (lines, echo) = (self.lines.clone(), self.options.echo);
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if echo {
                        println!("{line}");
                    }
                    lines
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(line);
                }
            });
        }
        self.running.push((id, child));
    }

    fn pid(&self, id: i32) -> Option<u32> {
        self.running
            .iter()
            .find(|(t, _)| *t == id)
            .map(|(_, c)| c.id())
    }

    fn signal(&self, id: i32, sig: &str) {
        if let Some(pid) = self.pid(id) {
            send_signal(i64::from(pid), sig);
        }
    }

    /// Reaps exited tasks; returns their ids.
    fn reap(&mut self) -> Vec<i32> {
        let mut gone = Vec::new();
        self.running.retain_mut(|(id, c)| match c.try_wait() {
            Ok(Some(status)) => {
                gone.push((*id, status.code()));
                false
            }
            Ok(None) => true,
            Err(_) => false,
        });
        self.exits.extend(gone.iter().copied());
        gone.into_iter().map(|(id, _)| id).collect()
    }

    fn said(&self, who: &str, what: &str) -> bool {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|l| line_is_from(l, who) && l.contains(what))
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for (_, c) in &mut self.running {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn who(id: i32) -> String {
    format!("{JOB}/{id}")
}

/// Runs a whole job under `options.scenario`; `binary` is the `coord-demo` executable (for the
/// task processes).
pub async fn run_job(binary: &Path, options: JobOptions) -> JobOutcome {
    let epoch_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let tl = Timeline::new("coord-demo".into(), epoch_ms);
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    // The supervisor's own lines go into the record too.
    let say = |what: String| {
        let line = tl.say(&what);
        lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(line);
    };
    let mut cluster = Ensemble::start(
        3,
        [
            "--job",
            &format!("{JOB}={}", options.tasks),
            "--recoverable-job",
            JOB,
            "--heartbeat-timeout-ms",
            "4000",
        ]
        .map(String::from)
        .to_vec(),
    );
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    say(format!("ensemble up: replicas 1-3, leader {leader}"));
    let mut tasks = Tasks {
        binary: binary.to_path_buf(),
        endpoints: cluster.endpoints(),
        checkpoint_dir: cluster.root().join("checkpoints"),
        options: options.clone(),
        epoch_ms,
        running: Vec::new(),
        lines: lines.clone(),
        exits: Vec::new(),
    };
    for id in 0..options.tasks as i32 {
        tasks.spawn(id);
    }
    let deadline =
        Instant::now() + Duration::from_secs(60) + options.step_time * options.steps as u32 * 3;
    // Let the job run a few steps before anything happens.
    wait_for(deadline, || {
        (0..options.tasks as i32).all(|id| tasks.said(&who(id), "starting at step 1"))
    })
    .await;
    tokio::time::sleep(options.step_time * 10).await;

    // Who gets preempted, and whether they come back.
    let preempted: Vec<i32> = match options.scenario {
        Scenario::Chief => vec![0],
        Scenario::Election => vec![1],
        Scenario::Two => vec![1, 2],
        Scenario::Dies => vec![1],
    };
    let mut killed_replica = None;
    match options.scenario {
        Scenario::Chief | Scenario::Two => {}
        Scenario::Election => {
            let l = leader_now(&mut cluster).await;
            tokio::task::block_in_place(|| cluster.kill(l));
            say(format!(
                "kill -9 replica {l} (the leader): an election begins"
            ));
            killed_replica = Some((l, Instant::now()));
        }
        Scenario::Dies => {
            tasks.signal(2, "KILL");
            say(format!(
                "kill -9 {} (it will never reach the barrier)",
                who(2)
            ));
        }
    }
    for &id in &preempted {
        tasks.signal(id, "TERM");
        say(format!("SIGTERM to {}", who(id)));
    }

    // Restart what exits; in the chief scenario the leader dies as the chief exits.
    let mut restarted: Vec<i32> = Vec::new();
    loop {
        if Instant::now() > deadline {
            say("the job did not finish in time; stopping it".into());
            break;
        }
        let gone = tasks.reap();
        for id in gone {
            if options.scenario == Scenario::Chief && id == 0 && killed_replica.is_none() {
                let l = leader_now(&mut cluster).await;
                tokio::task::block_in_place(|| cluster.kill(l));
                say(format!(
                    "kill -9 replica {l} (the leader, on the chief's host)"
                ));
                killed_replica = Some((l, Instant::now()));
            }
            if preempted.contains(&id)
                && !restarted.contains(&id)
                && options.scenario != Scenario::Dies
            {
                say(format!("restarting {}", who(id)));
                tasks.spawn(id);
                restarted.push(id);
            }
        }
        if let Some((l, at)) = killed_replica {
            if at.elapsed() > Duration::from_secs(1) && !cluster.is_running(l) {
                tokio::task::block_in_place(|| cluster.spawn(l));
                let now = leader_now(&mut cluster).await;
                say(format!("replica {l} restarted; leader is replica {now}"));
            }
        }
        if tasks.running.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exits = std::mem::take(&mut tasks.exits);
    drop(tasks);
    let lines = std::mem::take(&mut *lines.lock().unwrap_or_else(PoisonError::into_inner));
    JobOutcome { lines, exits }
}

async fn leader_now(cluster: &mut Ensemble) -> u64 {
    cluster.wait_for_leader(Duration::from_secs(30)).await
}

async fn wait_for(deadline: Instant, mut f: impl FnMut() -> bool) {
    while !f() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! One training task of the demo job: a step loop with preemption sync and checkpoints.
//!
//! The task registers, resumes from its last checkpoint (taken at a sync point every task agreed
//! on) once every task is there, and runs steps. On
//! SIGTERM it will be preempted `grace` later: it publishes the notice, and at the agreed sync
//! point every task writes a checkpoint marker; the preempted task then exits, the others wait for
//! it to come back (barrier `demo/resume/<step>`) and go on together. Every event is printed as
//! one timeline line (`<seconds since the job's epoch> <task> <event>`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_agent::preemption::{
    parse_death_time, PreemptionEvent, PreemptionOptions, PreemptionSyncManager, SigtermNotifier,
};
use coord_agent::{Agent, AgentConfig};

/// What a task needs to know.
#[derive(Clone, Debug)]
pub struct TaskArgs {
    pub endpoints: Vec<String>,
    pub job: String,
    pub task_id: i32,
    /// Last step of the job.
    pub steps: i64,
    pub step_time: Duration,
    /// Death time after SIGTERM.
    pub grace: Duration,
    pub checkpoint_dir: PathBuf,
    /// Unix time (ms) the timeline counts from (shared by every process of the job).
    pub epoch_ms: u64,
}

/// Prints timeline lines for one task.
#[derive(Clone)]
pub struct Timeline {
    who: String,
    epoch_ms: u64,
}

impl Timeline {
    pub fn new(who: String, epoch_ms: u64) -> Self {
        Self { who, epoch_ms }
    }

    /// Prints the line (one write, so that lines from concurrent tasks do not interleave) and
    /// returns it.
    pub fn say(&self, what: impl AsRef<str>) -> String {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let t = now.saturating_sub(self.epoch_ms) as f64 / 1000.0;
        let line = format!("{t:8.3}s  {:<10} {}", self.who, what.as_ref());
        println!("{line}");
        line
    }
}

/// The checkpoint key of a task.
pub fn checkpoint_key(job: &str, task: i32) -> String {
    format!("demo/ckpt/{job}:{task}")
}

/// Runs the task to its last step; returns the process exit code.
pub async fn run(args: TaskArgs) -> i32 {
    let who = format!("{}/{}", args.job, args.task_id);
    let tl = Timeline::new(who, args.epoch_ms);
    let mut config = AgentConfig::new(args.endpoints.clone(), args.job.clone(), args.task_id);
    config.heartbeat_interval = Duration::from_millis(500);
    config.unavailable_after = Duration::from_secs(60);
    let err_tl = tl.clone();
    let agent = match Agent::new(config.clone(), move |e| {
        err_tl.say(format!("agent error: {}", e.message()));
    }) {
        Ok(a) => a,
        Err(e) => {
            tl.say(format!("cannot create the agent: {e}"));
            return 2;
        }
    };
    if let Err(e) = agent.connect().await {
        tl.say(format!("cannot register: {}", e.message()));
        return 2;
    }
    tl.say(format!(
        "registered (incarnation {:#x})",
        config.incarnation
    ));

    // This task's last checkpoint. Checkpoints are written only at a sync point every task
    // agreed on, so the others checkpoint the same step (perhaps a moment later than this task,
    // which exited right after its own): the resume barrier below waits for all of them. Taking
    // the minimum of everyone's checkpoints here instead raced with the slower ones and restarted
    // from scratch.
    let resume = match agent
        .try_get_key_value(&checkpoint_key(&args.job, args.task_id))
        .await
    {
        Ok(v) => v
            .and_then(|v| String::from_utf8_lossy(&v).parse::<i64>().ok())
            .unwrap_or(0),
        Err(e) => {
            tl.say(format!("cannot read the checkpoint: {}", e.message()));
            return 2;
        }
    };
    if resume > 0 {
        tl.say(format!(
            "restored checkpoint of step {resume}; waiting for everyone"
        ));
        if !resume_together(&agent, &tl, resume).await {
            return 2;
        }
    }

    // SIGTERM means preemption, `grace` later.
    let preempted_at: Arc<std::sync::Mutex<Option<SystemTime>>> = Arc::default();
    let ev_tl = tl.clone();
    let at = preempted_at.clone();
    let psm = PreemptionSyncManager::start(
        agent.clone(),
        Box::new(SigtermNotifier { grace: args.grace }),
        PreemptionOptions::default(),
        move |e| {
            let line = match e {
                PreemptionEvent::Notified { death_time } => {
                    if let Ok(t) = parse_death_time(&death_time) {
                        *at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(t);
                    }
                    format!("got SIGTERM: preempted at {death_time}")
                }
                PreemptionEvent::NoticeSent { death_time } => {
                    format!("published preemption notice (death time {death_time})")
                }
                PreemptionEvent::NoticeReceived { round, death_time } => {
                    format!("preemption notice seen (round {round}, death time {death_time})")
                }
                PreemptionEvent::SyncPoint { round, step } => {
                    format!("sync point agreed: step {step} (round {round})")
                }
                PreemptionEvent::Failed { round, reason } => {
                    format!("sync failed (round {round}): {reason}")
                }
            };
            ev_tl.say(line);
        },
    );

    // SIGTERM is handled from here on.
    tl.say(format!("starting at step {}", resume + 1));
    for step in resume + 1..=args.steps {
        tokio::time::sleep(args.step_time).await;
        let death = *preempted_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if death.is_some_and(|d| SystemTime::now() >= d) {
            tl.say(format!("preempted at step {step} before any sync point"));
            return 3;
        }
        if !psm.reached_sync_point(step).await {
            continue;
        }
        if let Err(e) = checkpoint(&args, &agent, step).await {
            tl.say(format!("checkpoint failed: {e}"));
            return 2;
        }
        tl.say(format!("checkpoint at step {step}"));
        if death.is_some() {
            tl.say(format!("exiting for preemption after step {step}"));
            return 0;
        }
        tl.say(format!("waiting for everyone at step {step}"));
        if !resume_together(&agent, &tl, step).await {
            return 2;
        }
    }
    tl.say(format!("done at step {}", args.steps));
    drop(psm);
    let _ = agent.shutdown().await;
    0
}

/// Waits until every task is at the checkpoint of `step` (the preempted ones restarted).
async fn resume_together(agent: &Agent, tl: &Timeline, step: i64) -> bool {
    let barrier = format!("demo/resume/{step}");
    match agent
        .wait_at_barrier(&barrier, Duration::from_secs(120), &[])
        .await
    {
        Ok(()) => {
            tl.say(format!("resumed together after step {step}"));
            true
        }
        Err(e) => {
            tl.say(format!("resume barrier failed: {}", e.message()));
            false
        }
    }
}

/// Writes the checkpoint marker (a file in the task's directory, and the job-wide record).
async fn checkpoint(args: &TaskArgs, agent: &Agent, step: i64) -> Result<(), String> {
    std::fs::create_dir_all(&args.checkpoint_dir).map_err(|e| e.to_string())?;
    let file = args
        .checkpoint_dir
        .join(format!("{}-{}.step", args.job, args.task_id));
    std::fs::write(&file, step.to_string()).map_err(|e| format!("{}: {e}", file.display()))?;
    agent
        .update_key_value(&checkpoint_key(&args.job, args.task_id), step.to_string())
        .await
        .map_err(|e| e.message().to_string())
}

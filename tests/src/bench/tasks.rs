//! Many tasks against one ensemble: registration, WaitForAllTasks and one barrier across all of
//! them, with every task heartbeating, as a large training job does, and a leader kill -9.
//! Measures what the leader pays for it (`coord-bench scale` and `tasks`, see `scale`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_agent::proxy::barriers::{BarrierBatches, WaitBatches};
use coord_agent::proxy::beats::HeartbeatBatches;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::tensorflow as tf;
use futures::stream::{self, StreamExt};

pub use super::readings::{cpu_seconds, metric, parked_calls, rss_bytes, summed};
pub use super::wire_size::ACCEPT_GZIP;
pub(super) use super::wire_size::{answer_size, call_size};

/// What the run measured.
#[derive(Debug, Clone)]
pub struct TasksReport {
    pub tasks: usize,
    pub register: Duration,
    /// WaitForAllTasks: from the last task's call to every task's answer.
    pub wait_for_all: Duration,
    /// Bytes of every WaitForAllTasks answer together, as they crossed the wire (gzip-compressed
    /// when the tasks accept it; through the sidecars, their fetches, uncompressed).
    pub wait_for_all_bytes: u64,
    /// WaitForAllTasks answers that crossed the wire: one per task, or the sidecars' fetches.
    pub wait_for_all_fetches: u64,
    /// The size of the job's WaitForAllTasks answer gzipped, as the ensemble sent it to every
    /// caller that accepts gzip (the bytes it gzipped over the phase, per answer it gzipped);
    /// none if it sent none compressed.
    pub wait_for_all_gzipped: Option<u64>,
    /// Bytes of each task's device (one `DeviceAttributes`; 0 = no devices).
    pub device_bytes: usize,
    /// Leader RSS with every task's WaitForAllTasks call but one parked.
    pub leader_rss_waits_parked: u64,
    /// The tasks' barrier and WaitForAllTasks arrivals were recorded together by their sidecars,
    /// each waiting with one call (see [`Load::arrivals_together`]).
    pub arrivals_together: bool,
    /// From the moment the last task arrived at the barrier to the moment every task's call
    /// returned.
    pub barrier_release: Duration,
    /// Leader CPU, in cores, while the tasks only heartbeat.
    pub heartbeat_cpu_cores: f64,
    /// Heartbeats the tasks sent a second meanwhile, and calls that carried them (fewer when the
    /// simulated sidecars send their tasks' heartbeats together).
    pub heartbeats_per_second: f64,
    pub heartbeat_calls_per_second: f64,
    pub leader_rss_before: u64,
    /// All tasks registered and heartbeating, nothing parked.
    pub leader_rss_registered: u64,
    /// After WaitForAllTasks, just before the barrier: the base the parked calls are measured
    /// from (what the answers before left in the allocator is not theirs).
    pub leader_rss_before_barrier: u64,
    /// And every task but one parked at the barrier.
    pub leader_rss_after: u64,
    pub heartbeat_errors: u64,
    /// After a kill -9 of the leader: the longest any task went between two answered heartbeats,
    /// less the heartbeat interval (the stall the kill caused it).
    pub kill_stall: Duration,
    /// Heartbeats that failed after the kill (a task declared dead fails every later one).
    pub heartbeat_errors_after_kill: u64,
    /// The load generator's own lateness: the latest any heartbeat was sent after its time, and
    /// how many went over a second late (time a task was silent that the ensemble never saw).
    pub heartbeat_send_late: Duration,
    pub heartbeats_sent_late: u64,
}

impl TasksReport {
    pub fn rss_per_registered_task(&self) -> f64 {
        self.leader_rss_registered
            .saturating_sub(self.leader_rss_before) as f64
            / self.tasks as f64
    }

    /// What each parked WaitForAllTasks call adds to the leader (measured after the barrier).
    pub fn rss_per_parked_wait(&self) -> f64 {
        self.leader_rss_waits_parked
            .saturating_sub(self.leader_rss_after) as f64
            / self.tasks.saturating_sub(1).max(1) as f64
    }

    /// What each task waiting at the barrier adds to the leader (its parked call, or its sidecar's
    /// share of one).
    pub fn rss_per_parked_call(&self) -> f64 {
        self.leader_rss_after
            .saturating_sub(self.leader_rss_before_barrier) as f64
            / self.tasks.saturating_sub(1).max(1) as f64
    }
}

/// Where in the heartbeat interval task `i` heartbeats, in [0, 1): scattered (splitmix64 of `i`),
/// so that the tasks a connection carries heartbeat at independent moments, as independent tasks
/// do. (`i % 1000` put a connection's tasks on a few shared moments, all of them on one at
/// 100,000 tasks over 1,000 connections: a sidecar would send those heartbeats together at no
/// cost.)
fn phase_of(i: usize) -> f64 {
    (scrambled(i as u64) % 1_000_000) as f64 / 1_000_000.0
}

pub(super) fn task(i: usize) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: i32::try_from(i).unwrap_or(i32::MAX),
        recoverable: false,
    }
}

/// A spawned task that is aborted if the run ends before it is awaited: a run that fails must
/// not leave thousands of simulated tasks calling an ensemble that is gone.
pub(super) struct Spawned<T>(tokio::task::JoinHandle<T>);

impl<T> Spawned<T> {
    pub(super) fn new(f: impl std::future::Future<Output = T> + Send + 'static) -> Self
    where
        T: Send + 'static,
    {
        Self(tokio::spawn(f))
    }

    pub(super) async fn join(mut self) -> Result<T, String> {
        (&mut self.0).await.map_err(|e| e.to_string())
    }
}

impl<T> Drop for Spawned<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts `call(i)` for each of the first `n` tasks, `per_second` a second (0: all at once).
async fn paced<T>(
    n: usize,
    per_second: usize,
    call: impl Fn(usize) -> Spawned<T>,
) -> Vec<Spawned<T>> {
    const STEP: Duration = Duration::from_millis(10);
    let per_step = (per_second / 100).max(1);
    let mut out = Vec::with_capacity(n);
    let mut next = tokio::time::Instant::now();
    for i in 0..n {
        if per_second > 0 && i > 0 && i % per_step == 0 {
            next += STEP;
            tokio::time::sleep_until(next).await;
        }
        out.push(call(i));
    }
    out
}

/// Waits until `parked()` reaches `count` with the calls in `calls` still running; a call that
/// returns first fails the run.
pub(super) async fn parked_until<T: std::fmt::Debug>(
    calls: Vec<Spawned<T>>,
    parked: impl Fn() -> u64,
    count: u64,
    what: &str,
) -> Result<Vec<Spawned<T>>, String> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while parked() < count {
        if let Some(done) = calls.iter().position(|h| h.0.is_finished()) {
            let early = calls
                .into_iter()
                .nth(done)
                .ok_or("lost a call")?
                .join()
                .await;
            return Err(format!(
                "a {what} call returned before the last task's: {early:?}"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!("only {} of {count} calls parked", parked()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(calls)
}

/// `n` scrambled (splitmix64's finalizer): a task's heartbeat phase, and a device incarnation as
/// random-looking as TensorFlow's, the same in every run.
fn scrambled(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The type URL TensorFlow packs each device's `DeviceAttributes` under.
const DEVICE_ATTRIBUTES_URL: &str = "type.googleapis.com/tensorflow.DeviceAttributes";

/// Task `i`'s WaitForAllTasks as TF 2.21 sends it (its device list always present): one CPU
/// device of about `device_bytes` bytes (a `DeviceAttributes` with its name, type, memory limit,
/// incarnation and a description padded to the size), or none.
pub(super) fn wait_request(i: usize, device_bytes: usize) -> tf::WaitForAllTasksRequest {
    use prost::encoding::{fixed64, int64, string};
    let device = (device_bytes > 0).then(|| {
        let mut value = Vec::with_capacity(device_bytes);
        string::encode(
            1,
            &format!("/job:worker/replica:0/task:{i}/device:CPU:0"),
            &mut value,
        );
        string::encode(2, &"CPU".to_string(), &mut value);
        int64::encode(4, &(1_i64 << 34), &mut value);
        // TensorFlow draws each device's incarnation at random: 8 bytes gzip cannot shorten.
        fixed64::encode(6, &scrambled(i as u64), &mut value);
        let pad = device_bytes.saturating_sub(value.len() + 3);
        string::encode(7, &"x".repeat(pad), &mut value);
        tf::AnyMessage {
            type_url: DEVICE_ATTRIBUTES_URL.into(),
            value: value.into(),
        }
    });
    tf::WaitForAllTasksRequest {
        source_task: Some(task(i)),
        device_info: Some(tf::DeviceInfo {
            device: device.into_iter().collect(),
        }),
        local_device_info: None,
    }
}

/// The simulated job.
#[derive(Clone, Debug)]
pub struct Load {
    pub tasks: usize,
    /// Connections the tasks share, as sidecars carrying several tasks each would.
    pub connections: usize,
    /// Bytes of each task's one device (0: none).
    pub device_bytes: usize,
    /// Each task heartbeats this often.
    pub heartbeat_every: Duration,
    /// Leader CPU is read over this long, with the tasks only heartbeating.
    pub cpu_window: Duration,
    /// Barrier and WaitForAllTasks calls per second while the tasks gather (0: all at once). A
    /// job's tasks reach a barrier over seconds; all at once, 100,000 simulated tasks and three
    /// replicas on two cores starve the heartbeats sent meanwhile.
    pub arrivals_per_second: usize,
    /// Each connection's sidecar holds its tasks' heartbeats this long and sends them together,
    /// as coord-proxy does (zero: each task's heartbeat is its own TensorFlow call).
    pub heartbeat_batch: Duration,
    /// Each connection's sidecar records its tasks' Barrier and WaitForAllTasks arrivals together
    /// and waits with one call (fetching the job's devices once), as coord-proxy does (false: each
    /// task's call parks on the leader, as a task talking to the ensemble directly sends it).
    pub arrivals_together: bool,
}

/// Runs the whole scenario against an ensemble configured with `--job worker=<tasks>`, whose
/// leader runs as process `leader_pid`; `ensemble` sums a metric over its replicas ([`summed`](super::readings::summed) of its cluster).
pub async fn run(
    endpoints: Vec<String>,
    load: &Load,
    leader_pid: u32,
    ensemble: impl Fn(&str) -> u64,
    kill_leader: impl FnOnce(),
) -> Result<TasksReport, String> {
    // Calls waiting in the ensemble: parked on the leader (only a leader parks any), or held by a
    // follower that waits on the leader with one call for all its callers of a round (a client
    // may call a follower; see the server's `api::relayed_waits`). That one call is counted
    // beside its callers: the sum may reach a count while as many calls as the followers hold
    // shared waits are still on their way.
    let parked = || ensemble("coord_parked_calls") + ensemble("coord_relayed_waiting_calls");
    let Load {
        tasks,
        connections,
        device_bytes,
        heartbeat_every,
        cpu_window,
        arrivals_per_second,
        heartbeat_batch,
        arrivals_together,
    } = load.clone();
    let clients: Vec<CoordClient> = (0..connections.max(1))
        .map(|_| CoordClient::new(ClientOptions::new(endpoints.clone())).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for c in &clients {
        c.find_leader().await.ok_or("no leader")?;
    }
    let client = |i: usize| clients[i % clients.len()].clone();
    // One sidecar per connection: coord-proxy's batching, with the task's hop to its own host's
    // sidecar left out.
    let sidecars: Vec<Arc<HeartbeatBatches>> = clients
        .iter()
        .map(|_| Arc::new(HeartbeatBatches::new(heartbeat_batch)))
        .collect();
    let barrier_sidecars: Vec<Arc<BarrierBatches>> = clients
        .iter()
        .map(|_| Arc::new(BarrierBatches::new(arrivals_together)))
        .collect();
    let wait_sidecars: Vec<Arc<WaitBatches>> = clients
        .iter()
        .map(|_| Arc::new(WaitBatches::new(arrivals_together)))
        .collect();
    let rss_before = rss_bytes(leader_pid).unwrap_or(0);

    // Each task heartbeats from its registration on, as a real one does (a registration counts
    // as a heartbeat: a task that waited for the whole job to register first could miss its
    // timeout), at its own point of the interval, as independent tasks' heartbeats are (the
    // tasks a connection carries too).
    let stop = Arc::new(AtomicBool::new(false));
    let heartbeat_errors = Arc::new(AtomicU64::new(0));
    let heartbeats_sent = Arc::new(AtomicU64::new(0));
    // The longest gap between two answered heartbeats of any task, in ms, since the last reset.
    let longest_gap = Arc::new(AtomicU64::new(0));
    // The generator's lateness: the latest send after its tick's time, in ms, and sends over 1 s.
    let (send_late, sent_late) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let heartbeat = |i: usize| {
        let (c, sidecar, stop, errors, sent, gap) = (
            client(i),
            sidecars[i % sidecars.len()].clone(),
            stop.clone(),
            heartbeat_errors.clone(),
            heartbeats_sent.clone(),
            longest_gap.clone(),
        );
        let (send_late, sent_late) = (send_late.clone(), sent_late.clone());
        Spawned::new(async move {
            let first = tokio::time::Instant::now() + heartbeat_every.mul_f64(phase_of(i));
            let mut tick = tokio::time::interval_at(first, heartbeat_every);
            let mut answered = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let late = tick.tick().await.elapsed();
                send_late.fetch_max(late.as_millis() as u64, Ordering::Relaxed);
                if late > Duration::from_secs(1) {
                    sent_late.fetch_add(1, Ordering::Relaxed);
                }
                sent.fetch_add(1, Ordering::Relaxed);
                let req = tf::HeartbeatRequest {
                    incarnation: i as u64 + 1,
                    source_task: Some(task(i)),
                };
                if sidecar.heartbeat(&c, req).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                } else {
                    let ms = answered.elapsed().as_millis() as u64;
                    gap.fetch_max(ms, Ordering::Relaxed);
                    answered = Instant::now();
                }
            }
        })
    };
    let started = Instant::now();
    let registered: Vec<Result<Spawned<()>, String>> = stream::iter(0..tasks)
        .map(|i| {
            let c = client(i);
            let heartbeat = &heartbeat;
            async move {
                c.register_task(&task(i), i as u64 + 1)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(heartbeat(i))
            }
        })
        .buffer_unordered(512)
        .collect()
        .await;
    let register = started.elapsed();
    let beats = registered
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("registration failed: {e}"))?;
    eprintln!("registered {tasks} tasks in {register:?}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = || sidecars.iter().map(|s| s.calls()).sum::<u64>();
    let (cpu0, sent0, calls0) = (
        cpu_seconds(leader_pid).unwrap_or(0.0),
        heartbeats_sent.load(Ordering::Relaxed),
        calls(),
    );
    let t0 = Instant::now();
    tokio::time::sleep(cpu_window).await;
    let secs = t0.elapsed().as_secs_f64();
    let heartbeat_cpu_cores = (cpu_seconds(leader_pid).unwrap_or(0.0) - cpu0) / secs;
    let heartbeats_per_second = (heartbeats_sent.load(Ordering::Relaxed) - sent0) as f64 / secs;
    let heartbeat_calls_per_second = (calls() - calls0) as f64 / secs;
    let leader_rss_registered = rss_bytes(leader_pid).unwrap_or(0);
    eprintln!("heartbeats only: leader uses {heartbeat_cpu_cores:.2} cores for {heartbeats_per_second:.0} heartbeats a second in {heartbeat_calls_per_second:.0} calls");

    // All but one task arrive at a barrier and park; then all but one call WaitForAllTasks
    // and park too (the heap growing from the barrier's, so neither reuses what the other freed).
    // Then the last task calls WaitForAllTasks, then arrives at the barrier; each is timed from
    // that call until every task's call has returned.
    let arrive = |i: usize| {
        let (c, sidecar) = (
            client(i),
            barrier_sidecars[i % barrier_sidecars.len()].clone(),
        );
        Spawned::new(async move {
            let req = tf::BarrierRequest {
                barrier_id: "bench-barrier".into(),
                barrier_timeout_in_ms: 600_000,
                tasks: Vec::new(),
                source_task: Some(task(i)),
                counter: 0,
            };
            sidecar.send(&c, req).await.map(|_| Instant::now())
        })
    };
    let leader_rss_before_barrier = rss_bytes(leader_pid).unwrap_or(0);
    let early = paced(tasks - 1, arrivals_per_second, arrive).await;
    // Every early task waiting: each its own parked call, or recorded and waited on by its
    // sidecar's one parked call.
    let early = if arrivals_together {
        let waiting = || barrier_sidecars.iter().map(|s| s.waiting()).sum::<u64>();
        let early = parked_until(early, waiting, (tasks - 1) as u64, "barrier").await?;
        let waits = barrier_sidecars.iter().filter(|s| s.waiting() > 0).count() as u64;
        parked_until(early, &parked, waits, "barrier").await?
    } else {
        parked_until(early, &parked, (tasks - 1) as u64, "barrier").await?
    };
    let parked_at_barrier = parked();
    let leader_rss_after = rss_bytes(leader_pid).unwrap_or(0);

    // Each task's own call, its answer only counted as it crossed the wire; or through its
    // sidecar, which fetches the answer once for all its tasks (counted: the size of one).
    let wait = |i: usize| {
        let (c, sidecar) = (client(i), wait_sidecars[i % wait_sidecars.len()].clone());
        let req = wait_request(i, device_bytes);
        Spawned::new(async move {
            let bytes = if arrivals_together {
                5 + prost::Message::encoded_len(&sidecar.send(&c, req).await?)
            } else {
                c.forward(
                    req,
                    true,
                    true,
                    |ch, r| async move { answer_size(ch, r).await },
                )
                .await?
            };
            Ok::<_, tonic::Status>((Instant::now(), bytes as u64))
        })
    };
    let waiting = paced(tasks - 1, arrivals_per_second, wait).await;
    let waiting = if arrivals_together {
        let gathered = || wait_sidecars.iter().map(|s| s.waiting()).sum::<u64>();
        let waiting =
            parked_until(waiting, gathered, (tasks - 1) as u64, "WaitForAllTasks").await?;
        let waits = wait_sidecars.iter().filter(|s| s.waiting() > 0).count() as u64;
        parked_until(
            waiting,
            &parked,
            parked_at_barrier + waits,
            "WaitForAllTasks",
        )
        .await?
    } else {
        parked_until(
            waiting,
            &parked,
            parked_at_barrier + (tasks - 1) as u64,
            "WaitForAllTasks",
        )
        .await?
    };
    let leader_rss_waits_parked = rss_bytes(leader_pid).unwrap_or(0);
    let gzipped = || {
        (
            ensemble("coord_answer_compressions_total"),
            ensemble("coord_answer_gzipped_bytes_total"),
        )
    };
    let gzipped_before = gzipped();
    let last_call = Instant::now();
    let mut wait_for_all_bytes = 0;
    let mut answered = last_call;
    for w in waiting.into_iter().chain(std::iter::once(wait(tasks - 1))) {
        let (at, bytes) = w.join().await?.map_err(|e| format!("wait for all: {e}"))?;
        wait_for_all_bytes += bytes;
        answered = answered.max(at);
    }
    // Through the sidecars, the answers that crossed the wire are their fetches (counted at their
    // uncompressed size).
    let wait_for_all_fetches = if arrivals_together {
        let fetches = wait_sidecars.iter().map(|s| s.waits()).sum::<u64>();
        wait_for_all_bytes = wait_for_all_bytes / tasks as u64 * fetches;
        fetches
    } else {
        tasks as u64
    };
    let wait_for_all = answered.duration_since(last_call);
    // The ensemble gzips the job's answer once for all its callers (once per form a replica
    // serves): its size, what each answer that crossed the wire compressed carried.
    let wait_for_all_gzipped = {
        let after = gzipped();
        let answers = after.0.saturating_sub(gzipped_before.0);
        let bytes = after.1.saturating_sub(gzipped_before.1);
        (answers > 0 && bytes > 0).then(|| bytes / answers)
    };
    eprintln!(
        "WaitForAllTasks answered every task {wait_for_all:?} after the last call ({} MB)",
        wait_for_all_bytes / 1_000_000
    );

    let last_arrival = Instant::now();
    let last = arrive(tasks - 1);
    let mut released = Vec::with_capacity(tasks);
    for a in early.into_iter().chain(std::iter::once(last)) {
        released.push(a.join().await?.map_err(|e| format!("barrier: {e}"))?);
    }
    let barrier_release = released
        .iter()
        .max()
        .map_or(Duration::ZERO, |t| t.duration_since(last_arrival));
    // Where the release's time went: the last task's own answer (its arrival's commit), then the
    // others'.
    let mut after: Vec<Duration> = released
        .iter()
        .map(|t| t.duration_since(last_arrival))
        .collect();
    let own = after.last().copied().unwrap_or_default();
    after.sort();
    let first = after.first().copied().unwrap_or_default();
    let median = after.get(after.len() / 2).copied().unwrap_or_default();
    // Recorded together: when the last sidecar had the outcome from the ensemble, before it
    // answered its tasks (which, on hosts of their own, it would do beside the others).
    let sidecars_had_it = barrier_sidecars
        .iter()
        .filter_map(|s| s.outcome_at())
        .max()
        .map(|t| t.saturating_duration_since(last_arrival));
    eprintln!(
        "barrier: the last task answered {own:?} after its arrival; the first of all {first:?}, \
         half {median:?}, all {barrier_release:?}; every sidecar had the outcome after \
         {sidecars_had_it:?}"
    );
    // kill -9 the leader with every task heartbeating; the tasks' clients fail over.
    let errors_before_kill = heartbeat_errors.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(2)).await;
    longest_gap.store(0, Ordering::Relaxed);
    kill_leader();
    // Long enough for every task to heartbeat a few times after the election.
    tokio::time::sleep((heartbeat_every * 3).max(Duration::from_secs(8))).await;
    let kill_stall =
        Duration::from_millis(longest_gap.load(Ordering::Relaxed)).saturating_sub(heartbeat_every);
    let heartbeat_errors_after_kill = heartbeat_errors.load(Ordering::Relaxed) - errors_before_kill;
    eprintln!("leader killed: longest heartbeat stall {kill_stall:?}, {heartbeat_errors_after_kill} failed heartbeats");
    let heartbeat_send_late = Duration::from_millis(send_late.load(Ordering::Relaxed));
    let heartbeats_sent_late = sent_late.load(Ordering::Relaxed);
    eprintln!("the generator sent heartbeats up to {heartbeat_send_late:?} late, {heartbeats_sent_late} over 1 s");
    stop.store(true, Ordering::Relaxed);
    drop(beats);
    Ok(TasksReport {
        tasks,
        register,
        wait_for_all,
        wait_for_all_bytes,
        wait_for_all_fetches,
        wait_for_all_gzipped,
        device_bytes,
        leader_rss_waits_parked,
        barrier_release,
        arrivals_together,
        heartbeat_cpu_cores,
        heartbeats_per_second,
        heartbeat_calls_per_second,
        leader_rss_before: rss_before,
        leader_rss_registered,
        leader_rss_before_barrier,
        leader_rss_after,
        heartbeat_errors: errors_before_kill,
        kill_stall,
        heartbeat_errors_after_kill,
        heartbeat_send_late,
        heartbeats_sent_late,
    })
}

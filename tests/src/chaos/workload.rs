//! The clients of a chaos run: they keep the ensemble busy and record every operation with its
//! invocation and completion times and what it returned.
//!
//! - key-value clients: insert-if-absent, overwrite, get, delete on a few register keys, and
//!   increment/get on counter keys (every written value is unique, so the checker can tell writes
//!   apart);
//! - barrier tasks: every task of job `b` passes barrier `chaos` again and again, each instance
//!   with the next counter;
//! - a registration client: task `reg/0` registers, restarts with a new incarnation (refused),
//!   resets and registers again;
//! - raw-key clients: torch's store operations (`raw_clients`);
//! - a sidecar of the XLA job's two tasks asking GetAliveTasks round after round (`alive_clients`).
//!
//! A mutation that fails without an answer from the service has an unknown outcome; a read that
//! fails tells nothing and is not recorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_agent::CoordClient;

use super::raw_clients::{self, RawClients};
use super::{stopped, Endpoints};
use coord_proto::tensorflow as tf;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tonic::Code;

use super::history::{BarrierRecord, History, KvRecord, RegOp, RegRecord, RegRet};
use super::linearize::{KvOp, KvRet};

#[derive(Clone, Debug)]
pub struct WorkloadOptions {
    pub kv_clients: usize,
    /// Register keys `k0..`.
    pub keys: usize,
    /// Counter keys `ctr0..`.
    pub counters: usize,
    /// Tasks of job `b` that pass barriers (0 = no barrier traffic).
    pub barrier_tasks: i32,
    pub registrations: bool,
    /// Clients of the raw keys (torch's store operations; 0 = none).
    pub raw_clients: usize,
    /// The XLA job's tasks ask GetAliveTasks through one sidecar (`alive_clients`).
    pub alive_rounds: bool,
    /// A call fails only after no replica could serve it for this long.
    pub unavailable_after: Duration,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        Self {
            kv_clients: 4,
            keys: 3,
            counters: 1,
            barrier_tasks: 3,
            registrations: true,
            raw_clients: 3,
            alive_rounds: true,
            unavailable_after: Duration::from_secs(20),
        }
    }
}

pub struct Workload {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    /// The raw-key clients, whose final state is read once they stopped.
    pub raw: RawClients,
}

impl Workload {
    /// Stops the clients and waits for their calls in flight (up to `grace`, then abandons them;
    /// an abandoned call stays recorded as unknown). Returns whether every client stopped.
    pub async fn stop(&mut self, grace: Duration) -> bool {
        self.stop.store(true, Ordering::Relaxed);
        let mut handles = std::mem::take(&mut self.handles);
        handles.extend(self.raw.handles());
        let all = futures::future::join_all(handles);
        tokio::time::timeout(grace, all).await.is_ok()
    }
}

/// Starts the clients: the key-value and registration clients on `target`, the barrier tasks and
/// the raw-key clients on `named` (the same replicas, in a named namespace), so that every run
/// spreads its clients over two namespaces.
pub fn start(
    target: &Endpoints,
    named: &Endpoints,
    history: Arc<History>,
    seed: u64,
    options: &WorkloadOptions,
) -> Workload {
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for c in 0..options.kv_clients {
        let (cl, h, stop, o) = (
            target.client(options.unavailable_after),
            history.clone(),
            stop.clone(),
            options.clone(),
        );
        handles.push(tokio::spawn(kv_client(
            c,
            cl,
            h,
            stop,
            o,
            seed.wrapping_add(c as u64 * 7919),
        )));
    }
    for t in 0..options.barrier_tasks {
        let (cl, h, stop) = (
            named.client(options.unavailable_after),
            history.clone(),
            stop.clone(),
        );
        handles.push(tokio::spawn(barrier_task(
            t,
            options.barrier_tasks,
            cl,
            h,
            stop,
        )));
    }
    if options.registrations {
        let (cl, h, stop) = (
            target.client(options.unavailable_after),
            history.clone(),
            stop.clone(),
        );
        handles.push(tokio::spawn(registration_client(cl, h, stop, seed)));
    }
    if options.alive_rounds {
        let (cl, h, stop) = (
            target.client(options.unavailable_after),
            history.clone(),
            stop.clone(),
        );
        handles.push(tokio::spawn(super::alive_clients::client(cl, h, stop)));
    }
    let raw = raw_clients::start(
        named,
        &history,
        &stop,
        options.raw_clients,
        options.unavailable_after,
        seed ^ 0x7a3,
    );
    Workload { stop, handles, raw }
}

async fn kv_client(
    id: usize,
    c: CoordClient,
    h: Arc<History>,
    stop: Arc<AtomicBool>,
    o: WorkloadOptions,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let value = format!("c{id}-{n}");
        let counter = o.counters > 0 && rng.gen_bool(0.25);
        let (key, op) = if counter {
            let key = format!("ctr{}", rng.gen_range(0..o.counters));
            (
                key,
                if rng.gen_bool(0.7) {
                    KvOp::Increment(1)
                } else {
                    KvOp::Get
                },
            )
        } else {
            let key = format!("k{}", rng.gen_range(0..o.keys.max(1)));
            let op = match rng.gen_range(0..10) {
                0..=2 => KvOp::Insert(value),
                3..=5 => KvOp::Put(value),
                6..=8 => KvOp::Get,
                _ => KvOp::Delete,
            };
            (key, op)
        };
        let invoke = h.now_us();
        let ret: Option<Option<KvRet>> = match &op {
            KvOp::Insert(v) => Some(match c.insert(&key, v.clone(), false).await {
                Ok(()) => Some(KvRet::Ok),
                Err(s) if s.code() == Code::AlreadyExists => Some(KvRet::Exists),
                Err(_) => None,
            }),
            KvOp::Put(v) => Some(
                c.insert(&key, v.clone(), true)
                    .await
                    .ok()
                    .map(|()| KvRet::Ok),
            ),
            KvOp::Delete => Some(c.delete(&key).await.ok().map(|()| KvRet::Ok)),
            KvOp::Increment(d) => Some(c.increment(&key, *d).await.ok().map(KvRet::Number)),
            // Only the raw-key clients compare and set (torch's COMPARE_SET).
            KvOp::CompareSet { .. } => None,
            // A failed read is not recorded: it tells nothing and changed nothing.
            KvOp::Get => match c.try_get(&key).await {
                Ok(v) => Some(Some(KvRet::Value(
                    v.map(|b| String::from_utf8_lossy(&b).to_string()),
                ))),
                Err(_) => None,
            },
        };
        let answered = matches!(ret, Some(Some(_)));
        h.record_call(
            format!("{op:?} of {key:?} by client {id}"),
            invoke,
            answered,
        );
        let Some(ret) = ret else { continue };
        let complete = ret.is_some().then(|| h.now_us());
        h.record_kv(KvRecord {
            client: id,
            key,
            op,
            ret,
            invoke_us: invoke,
            complete_us: complete,
        });
        tokio::time::sleep(Duration::from_millis(rng.gen_range(2..15))).await;
    }
}

fn task(job: &str, id: i32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: job.into(),
        task_id: id,
        recoverable: false,
    }
}

async fn barrier_task(id: i32, of: i32, c: CoordClient, h: Arc<History>, stop: Arc<AtomicBool>) {
    // Only job `b` takes part: the registration client's task must not hold barriers up.
    let participants: Vec<tf::CoordinatedTask> = (0..of).map(|t| task("b", t)).collect();
    let mut counter = 0i64;
    while !stop.load(Ordering::Relaxed) {
        let invoke = h.now_us();
        let me = task("b", id);
        let call = c.barrier(
            "chaos",
            counter,
            Duration::from_secs(15),
            &participants,
            &me,
        );
        // At the end of the run the other tasks stop arriving: abandon the call (its outcome is
        // unknown) instead of waiting for the barrier to time out.
        let r = tokio::select! {
            r = call => r,
            () = stopped(&stop) => Err(tonic::Status::unavailable("abandoned at the end of the run")),
        };
        let outcome = match &r {
            Ok(_) => Some(Ok(())),
            // No answer: the instance may still be running; ask for the same one again.
            Err(s) if s.code() == Code::Unavailable => None,
            Err(s) => Some(Err(s.code() as i32)),
        };
        h.record_call(
            format!("barrier \"chaos\" #{counter} by task b/{id}"),
            invoke,
            outcome.is_some(),
        );
        h.record_barrier(BarrierRecord {
            task: id,
            barrier: "chaos".into(),
            counter,
            invoke_us: invoke,
            complete_us: outcome.is_some().then(|| h.now_us()),
            outcome,
        });
        if outcome.is_some() {
            counter += 1;
        }
    }
}

async fn registration_client(c: CoordClient, h: Arc<History>, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let t = task("reg", 0);
    let mut incarnation = 1u64;
    while !stop.load(Ordering::Relaxed) {
        let op = if rng.gen_bool(0.6) {
            RegOp::Register(incarnation)
        } else if rng.gen_bool(0.5) {
            incarnation += 1;
            RegOp::Register(incarnation)
        } else {
            RegOp::Reset
        };
        let invoke = h.now_us();
        let r = match &op {
            RegOp::Register(i) => c.register_task(&t, *i).await.map(|_| ()),
            RegOp::Reset => c.reset_task(&t).await,
        };
        let ret = match r {
            Ok(()) => Some(RegRet::Ok),
            Err(s) if s.code() == Code::Aborted => Some(RegRet::Aborted),
            Err(s) if s.code() == Code::FailedPrecondition => Some(RegRet::FailedPrecondition),
            Err(_) => None,
        };
        h.record_call(format!("{op:?} of task reg/0"), invoke, ret.is_some());
        h.record_registration(RegRecord {
            op,
            ret: ret.clone(),
            invoke_us: invoke,
            complete_us: ret.is_some().then(|| h.now_us()),
        });
        tokio::time::sleep(Duration::from_millis(rng.gen_range(50..250))).await;
    }
}

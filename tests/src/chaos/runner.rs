//! One chaos run: a proxied 3-replica ensemble, the workload, a seeded fault schedule, then
//! healing, final reads and the checkers.
//!
//! A run ends with every fault healed and checks that the ensemble is live again (a leader and a
//! committed write within a deadline) before it stops the clients, then reads every key so that a
//! lost acknowledged write shows up as a non-linearizable history. A run with anomalies keeps the
//! ensemble's directory (data and logs) and writes into it the seed, the schedule, the event log,
//! the history and the anomalies; `coord-bench chaos --seed S` replays the same schedule.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::history::{History, KvRecord};
use super::linearize::{KvOp, KvRet};
use super::recovery;
use super::schedule::{self, Fault, Step, Target};
use super::workload::{self, WorkloadOptions};
use crate::cluster::{Cluster, ClusterOptions};

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: u64,
    pub length: Duration,
    pub workload: WorkloadOptions,
    /// Search budget of each linearizability check (states explored).
    pub budget: usize,
    /// The ensemble serves TLS, peers and clients alike.
    pub tls: bool,
}

impl RunOptions {
    pub fn new(seed: u64, length: Duration) -> Self {
        Self {
            seed,
            length,
            workload: WorkloadOptions::default(),
            budget: 20_000_000,
            tls: false,
        }
    }
}

#[derive(Debug, Default)]
pub struct RunReport {
    pub seed: u64,
    pub faults: usize,
    /// What happened when, including whom each fault hit.
    pub events: Vec<String>,
    pub kv_ops: usize,
    /// Mutations whose outcome the client never learned.
    pub kv_unknown: usize,
    pub barrier_passes: usize,
    pub registrations: usize,
    /// GetAliveTasks calls of the XLA job's two tasks answered (each a round), and their rounds
    /// read with AwaitAlive.
    pub alive_rounds: usize,
    pub alive_answers: usize,
    /// Raw-key (torch store) operations other than ADD, COMPARE_SET and GET, which count as kv ops.
    pub raw_ops: usize,
    /// The highest Raft term at the end (how many elections the faults caused, roughly).
    pub final_term: u64,
    pub anomalies: Vec<String>,
    /// Where a failed run's record was kept.
    pub saved: Option<PathBuf>,
    /// How long the checkers took.
    pub check_time: Duration,
    /// The longest any call took after the last fault healed (counted from the heal, or from the
    /// call's start if later), and which call it was.
    pub longest_after_heal: Duration,
    pub longest_call: String,
}

impl RunReport {
    pub fn summary(&self) -> String {
        format!(
            "seed {}: {} faults, {} kv ops ({} unknown), {} barrier passes, {} registrations, {} GetAliveTasks rounds ({} answers read), {} raw ops, term {}, longest call after the last heal {:.3}s ({}), checked in {:.1?}, {} anomalies{}",
            self.seed,
            self.faults,
            self.kv_ops,
            self.kv_unknown,
            self.barrier_passes,
            self.registrations,
            self.alive_rounds,
            self.alive_answers,
            self.raw_ops,
            self.final_term,
            self.longest_after_heal.as_secs_f64(),
            self.longest_call,
            self.check_time,
            self.anomalies.len(),
            self.saved
                .as_ref()
                .map(|p| format!(" (record kept in {})", p.display()))
                .unwrap_or_default()
        )
    }
}

/// The XLA job's GetAliveTasks calls that `counted`.
fn count_alive(history: &History, counted: impl Fn(&super::alive::AliveRecord) -> bool) -> usize {
    history
        .alive
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|r| counted(r))
        .count()
}

/// The replicas' flags in a chaos run: job `b` (the barrier tasks' job, which never registers, so
/// the default namespace's run never ends: the key-value clients' keys stay), `reg` for the
/// registration client, `x` for jaxlib's tasks (the XLA job), heartbeats off (the clients do not
/// send them). The barrier tasks themselves run in the named namespace ([`NAMED`]), declared with
/// the same job.
pub fn chaos_cluster_args() -> Vec<String> {
    [
        "--job",
        "b=3",
        "--job",
        "reg=1",
        "--job",
        "x=2",
        "--xla-job",
        "x",
        "--heartbeat-timeout-ms",
        "3600000",
    ]
    .map(String::from)
    .to_vec()
}

/// The named namespace of a run's barrier tasks and raw-key clients (see `workload::start`),
/// declared with the barrier tasks' job.
pub const NAMED: &str = "chaos";

/// Declares [`NAMED`] on the ensemble; the clients of `target` in it.
async fn declare_named(target: &super::Endpoints) -> super::Endpoints {
    let shape = coord_proto::coord::admin::NamespaceShape {
        jobs: [("b".to_string(), 3)].into_iter().collect(),
        heartbeat_timeout_ms: 3_600_000,
        ..Default::default()
    };
    target
        .client(Duration::from_secs(30))
        .declare_namespace(coord_proto::coord::admin::DeclareNamespaceRequest {
            name: NAMED.into(),
            shape: Some(shape),
            limits: None,
        })
        .await
        .expect("declare the run's named namespace");
    target.in_namespace(NAMED)
}

/// Who is down or frozen, so that targets resolve to replicas that can be hit.
struct Faults<'a> {
    cluster: &'a mut Cluster,
    started: Instant,
    events: Vec<String>,
    killed: Vec<u64>,
    paused: Vec<u64>,
    rng: u64,
}

impl Faults<'_> {
    fn log(&mut self, what: String) {
        let line = format!("{:>8.3}s {what}", self.started.elapsed().as_secs_f64());
        self.events.push(line);
    }

    /// The replica that says it leads in the highest term, among those that can answer.
    fn leader(&mut self) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for id in self.reachable() {
            if let Some(s) = self.cluster.status(id) {
                if s.state == "Leader" && best.is_none_or(|(_, t)| s.term > t) {
                    best = Some((id, s.term));
                }
            }
        }
        best.map(|(id, _)| id)
    }

    fn reachable(&self) -> Vec<u64> {
        self.cluster
            .ids()
            .into_iter()
            .filter(|id| !self.killed.contains(id) && !self.paused.contains(id))
            .collect()
    }

    /// A pseudo-random pick (a simple LCG seeded from the run's seed: which follower is hit is
    /// part of the replay).
    fn pick(&mut self, from: &[u64]) -> Option<u64> {
        self.rng = self
            .rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (!from.is_empty()).then(|| from[(self.rng >> 33) as usize % from.len()])
    }

    fn resolve(&mut self, t: Target, not: Option<u64>) -> Option<u64> {
        let candidates: Vec<u64> = self
            .reachable()
            .into_iter()
            .filter(|&id| Some(id) != not)
            .collect();
        match t {
            Target::Replica(id) => candidates.contains(&id).then_some(id),
            Target::Leader => match self.leader() {
                Some(l) if Some(l) != not => Some(l),
                _ => self.pick(&candidates),
            },
            Target::Follower => {
                let leader = self.leader();
                let followers: Vec<u64> = candidates
                    .iter()
                    .copied()
                    .filter(|&id| Some(id) != leader)
                    .collect();
                self.pick(&followers)
            }
        }
    }

    /// Applies `fault`; returns how to heal it, or None when it found no target.
    fn apply(&mut self, fault: &Fault) -> Option<Heal> {
        match *fault {
            Fault::Kill(t) => {
                let id = self.resolve(t, None)?;
                self.cluster.kill(id);
                self.killed.push(id);
                self.log(format!("{fault}: killed replica {id}"));
                Some(Heal::Restart(vec![id]))
            }
            Fault::KillAll => {
                let ids = self.cluster.ids();
                for &id in &ids {
                    self.cluster.kill(id);
                }
                self.killed.extend(&ids);
                self.log(format!("{fault}"));
                Some(Heal::Restart(ids))
            }
            Fault::Pause(t) => {
                let id = self.resolve(t, None)?;
                self.cluster.pause(id);
                self.paused.push(id);
                self.log(format!("{fault}: paused replica {id}"));
                Some(Heal::Resume(id))
            }
            Fault::Isolate(t, how) => {
                let id = self.resolve(t, None)?;
                self.cluster.net().isolate(id, how);
                self.log(format!("{fault}: isolated replica {id}"));
                Some(Heal::Net)
            }
            Fault::OneWay { from, to, how } => {
                let a = self.resolve(from, None)?;
                let b = self.resolve(to, Some(a))?;
                self.cluster.net().cut(a, b, how);
                self.log(format!("{fault}: cut {a} -> {b}"));
                Some(Heal::Net)
            }
            Fault::Restart(t) => {
                let id = self.resolve(t, None)?;
                let code = self.cluster.terminate(id, Duration::from_secs(10));
                self.cluster.spawn(id);
                self.log(format!(
                    "{fault}: replica {id} exited with {code:?} and was restarted"
                ));
                Some(Heal::Nothing)
            }
        }
    }

    fn heal(&mut self, heal: Heal) {
        match heal {
            Heal::Restart(ids) => {
                for &id in &ids {
                    self.cluster.spawn(id);
                }
                self.killed.retain(|k| !ids.contains(k));
                self.log(format!("restarted {ids:?}"));
            }
            Heal::Resume(id) => {
                self.cluster.resume(id);
                self.paused.retain(|&p| p != id);
                self.log(format!("resumed replica {id}"));
            }
            Heal::Net => {
                self.cluster.net().heal_all();
                self.log("healed the network".into());
            }
            Heal::Nothing => {}
        }
    }
}

enum Heal {
    Nothing,
    Restart(Vec<u64>),
    Resume(u64),
    Net,
}

/// Runs one chaos run and checks it.
pub async fn run(options: &RunOptions) -> RunReport {
    let steps = schedule::generate(options.seed, options.length);
    let mut cluster = Cluster::start(ClusterOptions {
        proxied: true,
        extra_args: chaos_cluster_args(),
        tls: options.tls,
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let target = super::Endpoints::of(&cluster, options.tls);
    let named = declare_named(&target).await;
    let history = Arc::new(History::default());
    let mut load = workload::start(
        &target,
        &named,
        history.clone(),
        options.seed,
        &options.workload,
    );

    let mut anomalies = Vec::new();
    let mut faults = Faults {
        cluster: &mut cluster,
        started: Instant::now(),
        events: Vec::new(),
        killed: Vec::new(),
        paused: Vec::new(),
        rng: options.seed,
    };
    // When the last fault healed (a graceful restart heals as it happens).
    let mut healed_us = 0;
    for step in &steps {
        tokio::time::sleep_until(faults.started + step.at).await;
        let healing = tokio::task::block_in_place(|| faults.apply(&step.fault));
        match healing {
            Some(Heal::Nothing) => healed_us = history.now_us(),
            Some(h) => {
                tokio::time::sleep(step.hold).await;
                tokio::task::block_in_place(|| faults.heal(h));
                healed_us = history.now_us();
            }
            None => faults.log(format!("{}: no target", step.fault)),
        }
    }
    tokio::time::sleep_until(faults.started + options.length).await;
    let mut events = std::mem::take(&mut faults.events);
    drop(faults);

    // Liveness after healing: a leader, and a write that commits (within the recovery bound,
    // checked with every other call below).
    let invoke = history.now_us();
    let live = async {
        cluster.wait_for_leader(Duration::from_secs(30)).await;
        target
            .client(Duration::from_secs(30))
            .insert("chaos/liveness", "ok", true)
            .await
    };
    let liveness = tokio::time::timeout(Duration::from_secs(45), live)
        .await
        .map_err(|_| "timed out".to_string())
        .and_then(|r| r.map_err(|s| s.to_string()));
    history.record_call("the liveness write".into(), invoke, liveness.is_ok());
    if let Err(e) = liveness {
        anomalies.push(format!(
            "the ensemble did not recover after every fault healed: {e}"
        ));
    }
    let stopping_us = history.now_us();
    if !load.stop(Duration::from_secs(40)).await {
        anomalies.push("clients still had calls running 40 s after they were told to stop".into());
    }
    let recovered = {
        let calls = history.calls.lock().map(|c| c.clone()).unwrap_or_default();
        recovery::check(&calls, healed_us, stopping_us, recovery::BOUND)
    };
    anomalies.extend(recovered.anomalies);
    anomalies.extend(super::raw_clients::finish(&named, &history, &load.raw).await);

    // Read every key at the end: an acknowledged write that was lost makes the key's history
    // non-linearizable.
    let reader = target.client(Duration::from_secs(30));
    let keys = (0..options.workload.keys)
        .map(|k| format!("k{k}"))
        .chain((0..options.workload.counters).map(|c| format!("ctr{c}")));
    for key in keys {
        let invoke = history.now_us();
        match reader.try_get(&key).await {
            Ok(v) => history.record_kv(KvRecord {
                client: usize::MAX,
                key,
                op: KvOp::Get,
                ret: Some(KvRet::Value(
                    v.map(|b| String::from_utf8_lossy(&b).to_string()),
                )),
                invoke_us: invoke,
                complete_us: Some(history.now_us()),
            }),
            Err(e) => anomalies.push(format!("final read of {key:?} failed: {e}")),
        }
    }

    for id in cluster.ids() {
        if cluster.log(id).contains("panicked") {
            anomalies.push(format!("replica {id} panicked (see its log)"));
        }
    }
    let final_term = cluster
        .ids()
        .into_iter()
        .filter_map(|id| cluster.status(id))
        .map(|s| s.term)
        .max()
        .unwrap_or(0);

    let checking = Instant::now();
    let check = tokio::task::block_in_place(|| history.check_all(options.budget));
    let check_time = checking.elapsed();
    anomalies.extend(check.0);

    let kv = history.kv.lock().map(|k| k.clone()).unwrap_or_default();
    let barriers = history
        .barriers
        .lock()
        .map(|b| b.clone())
        .unwrap_or_default();
    let registrations = history
        .registrations
        .lock()
        .map(|r| r.len())
        .unwrap_or_default();
    let mut report = RunReport {
        seed: options.seed,
        faults: steps.len(),
        kv_ops: kv.len(),
        kv_unknown: kv.iter().filter(|r| r.ret.is_none()).count(),
        barrier_passes: barriers
            .iter()
            .filter(|b| b.outcome == Some(Ok(())))
            .count(),
        registrations,
        alive_rounds: count_alive(&history, |r| r.joined.is_some()),
        alive_answers: count_alive(&history, |r| r.answer.is_some()),
        raw_ops: history.raw.lock().map(|r| r.len()).unwrap_or_default(),
        final_term,
        anomalies,
        saved: None,
        events: Vec::new(),
        check_time,
        longest_after_heal: recovered.longest,
        longest_call: recovered.longest_call,
    };
    if !report.anomalies.is_empty() {
        let dir = cluster.persist();
        save(&dir, options, &steps, &events, &history, &report);
        report.saved = Some(dir);
    }
    report.events = std::mem::take(&mut events);
    report
}

/// Writes a failed run's record next to the ensemble's data and logs.
fn save(
    dir: &std::path::Path,
    options: &RunOptions,
    steps: &[Step],
    events: &[String],
    history: &History,
    report: &RunReport,
) {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "seed {} length {:?}\nreplay: coord-bench chaos --seed {} --seconds {}\n",
        options.seed,
        options.length,
        options.seed,
        options.length.as_secs()
    );
    let _ = writeln!(text, "anomalies:");
    for a in &report.anomalies {
        let _ = writeln!(text, "  {a}");
    }
    let _ = writeln!(text, "\nevents:");
    for e in events {
        let _ = writeln!(text, "  {e}");
    }
    let _ = std::fs::write(dir.join("report.txt"), text);
    let _ = std::fs::write(
        dir.join("schedule.json"),
        serde_json::to_string_pretty(steps).unwrap_or_default(),
    );
    let _ = std::fs::write(dir.join("history.json"), history.to_json());
}

/// A run that must be clean: panics with the report (and where the record was kept) otherwise.
pub async fn run_clean(options: &RunOptions) -> RunReport {
    let report = run(options).await;
    eprintln!("chaos {}", report.summary());
    for e in &report.events {
        eprintln!("  {e}");
    }
    assert!(
        report.anomalies.is_empty(),
        "chaos run found anomalies: {:#?}\n{}",
        report.anomalies,
        report.summary()
    );
    report
}

//! What the chaos clients saw, and the checks run on it.
//!
//! - Key-value operations: each key's history must be linearizable (which also proves that no
//!   acknowledged write was lost: every run ends with a read of every key).
//! - Barrier passes: nobody passes an instance before every participant arrived, and all who got
//!   an answer for an instance got the same one.
//! - Task registrations: the service's answers must follow the incarnation rules in some order
//!   consistent with real time (a restarted task is refused until it is reset).
//! - jaxlib's GetAliveTasks rounds: each ask recorded once (see `alive`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::alive::{self, AliveRecord};
use super::linearize::{check, Entry, KvOp, KvRet, Model, Register, Verdict};
use super::raw::{self, RawFinal, RawRecord};
use super::recovery::CallTiming;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KvRecord {
    pub client: usize,
    pub key: String,
    pub op: KvOp,
    pub ret: Option<KvRet>,
    pub invoke_us: u64,
    pub complete_us: Option<u64>,
}

/// One task's call of one barrier instance.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BarrierRecord {
    pub task: i32,
    pub barrier: String,
    pub counter: i64,
    pub invoke_us: u64,
    pub complete_us: Option<u64>,
    /// `Some(Ok)` passed, `Some(Err(code))` failed, `None` unknown.
    pub outcome: Option<Result<(), i32>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
pub enum RegOp {
    Register(u64),
    Reset,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum RegRet {
    Ok,
    Aborted,
    FailedPrecondition,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RegRecord {
    pub op: RegOp,
    pub ret: Option<RegRet>,
    pub invoke_us: u64,
    pub complete_us: Option<u64>,
}

/// Everything recorded in a run; shared by the clients.
pub struct History {
    start: Instant,
    pub kv: Mutex<Vec<KvRecord>>,
    pub barriers: Mutex<Vec<BarrierRecord>>,
    pub registrations: Mutex<Vec<RegRecord>>,
    /// The XLA job's GetAliveTasks rounds (see `alive`).
    pub alive: Mutex<Vec<AliveRecord>>,
    /// The raw-key (torch store) operations, and what the raw keys held at the end.
    pub raw: Mutex<Vec<RawRecord>>,
    pub raw_final: Mutex<Option<RawFinal>>,
    /// Every call of every client, reads that failed included (see `recovery`).
    pub calls: Mutex<Vec<CallTiming>>,
}

impl Default for History {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            kv: Mutex::default(),
            barriers: Mutex::default(),
            registrations: Mutex::default(),
            alive: Mutex::default(),
            raw: Mutex::default(),
            raw_final: Mutex::default(),
            calls: Mutex::default(),
        }
    }
}

fn push<T>(m: &Mutex<Vec<T>>, v: T) {
    m.lock().unwrap_or_else(PoisonError::into_inner).push(v);
}

impl History {
    pub fn now_us(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    pub fn record_kv(&self, r: KvRecord) {
        push(&self.kv, r);
    }

    pub fn record_barrier(&self, r: BarrierRecord) {
        push(&self.barriers, r);
    }

    pub fn record_registration(&self, r: RegRecord) {
        push(&self.registrations, r);
    }

    pub fn record_alive(&self, r: AliveRecord) {
        push(&self.alive, r);
    }

    pub fn record_raw(&self, r: RawRecord) {
        push(&self.raw, r);
    }

    pub fn set_raw_final(&self, end: RawFinal) {
        *self
            .raw_final
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(end);
    }

    /// Records that a call made at `invoke_us` returned now.
    pub fn record_call(&self, what: String, invoke_us: u64, answered: bool) {
        let returned_us = self.now_us();
        push(
            &self.calls,
            CallTiming {
                what,
                invoke_us,
                returned_us,
                answered,
            },
        );
    }

    /// The history as JSON, for the record of a failed run.
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct Dump<'a> {
            kv: &'a [KvRecord],
            barriers: &'a [BarrierRecord],
            registrations: &'a [RegRecord],
            alive: &'a [AliveRecord],
            raw: &'a [RawRecord],
            raw_final: &'a Option<RawFinal>,
            calls: &'a [CallTiming],
        }
        let kv = self.kv.lock().unwrap_or_else(PoisonError::into_inner);
        let barriers = self.barriers.lock().unwrap_or_else(PoisonError::into_inner);
        let registrations = self
            .registrations
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let alive = self.alive.lock().unwrap_or_else(PoisonError::into_inner);
        let raw = self.raw.lock().unwrap_or_else(PoisonError::into_inner);
        let raw_final = self
            .raw_final
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        serde_json::to_string_pretty(&Dump {
            kv: &kv,
            barriers: &barriers,
            registrations: &registrations,
            alive: &alive,
            raw: &raw,
            raw_final: &raw_final,
            calls: &calls,
        })
        .unwrap_or_default()
    }

    /// Runs every checker; returns the anomalies found (empty = the run is clean) and how many
    /// operations were checked.
    pub fn check_all(&self, budget: usize) -> (Vec<String>, usize) {
        let mut anomalies = Vec::new();
        let kv = self
            .kv
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let checked = kv.len();
        anomalies.extend(check_kv(&kv, budget));
        anomalies.extend(check_barriers(
            &self.barriers.lock().unwrap_or_else(PoisonError::into_inner),
        ));
        anomalies.extend(check_registrations(
            &self
                .registrations
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            budget,
        ));
        anomalies.extend(alive::check(
            &self.alive.lock().unwrap_or_else(PoisonError::into_inner),
        ));
        let raw = self.raw.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(end) = &*self
            .raw_final
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            anomalies.extend(raw::check(&raw, end));
        } else if !raw.is_empty() {
            anomalies.push("the raw keys were not read at the end of the run".into());
        }
        (anomalies, checked + raw.len())
    }
}

/// Each key's history must be linearizable.
pub fn check_kv(records: &[KvRecord], budget: usize) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<Entry<KvOp, KvRet>>> = BTreeMap::new();
    for r in records {
        by_key.entry(&r.key).or_default().push(Entry {
            op: r.op.clone(),
            ret: r.ret.clone(),
            invoke: r.invoke_us,
            complete: r.complete_us,
        });
    }
    let mut out = Vec::new();
    for (key, entries) in by_key {
        match check(Register::default(), &entries, budget) {
            Verdict::Linearizable => {}
            Verdict::NotLinearizable { stuck_at } => out.push(format!(
                "key {key:?}: history of {} operations is not linearizable; no order can place {:?}",
                entries.len(),
                entries.get(stuck_at)
            )),
            Verdict::Inconclusive => out.push(format!(
                "key {key:?}: linearizability search of {} operations exceeded its budget (no verdict)",
                entries.len()
            )),
        }
    }
    out
}

/// Nobody passes an instance before every participant arrived; every definite answer for an
/// instance is the same. `participants` is the number of tasks that take part in every barrier.
pub fn check_barriers(records: &[BarrierRecord]) -> Vec<String> {
    let mut by_instance: HashMap<(&str, i64), Vec<&BarrierRecord>> = HashMap::new();
    for r in records {
        by_instance
            .entry((&r.barrier, r.counter))
            .or_default()
            .push(r);
    }
    let mut out = Vec::new();
    for ((id, counter), calls) in by_instance {
        let passed: Vec<&&BarrierRecord> =
            calls.iter().filter(|c| c.outcome == Some(Ok(()))).collect();
        let failed = calls.iter().any(|c| matches!(c.outcome, Some(Err(_))));
        if !passed.is_empty() && failed {
            out.push(format!(
                "barrier {id:?} #{counter}: some tasks passed while others were told it failed"
            ));
        }
        let Some(first_pass) = passed.iter().filter_map(|c| c.complete_us).min() else {
            continue;
        };
        // Every task that passed must have been matched by an arrival of every other task before
        // the first pass completed; the arrival is the first call of that task for the instance.
        let mut first_arrival: HashMap<i32, u64> = HashMap::new();
        for c in &calls {
            let at = first_arrival.entry(c.task).or_insert(c.invoke_us);
            *at = (*at).min(c.invoke_us);
        }
        if let Some((&task, &arrived)) = first_arrival.iter().max_by_key(|(_, &at)| at) {
            if arrived > first_pass {
                out.push(format!(
                    "barrier {id:?} #{counter}: a task passed at {first_pass} us, before task {task} arrived at {arrived} us"
                ));
            }
        }
    }
    out
}

/// The incarnation rules of one (non-recoverable) task, as a sequential model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum TaskReg {
    Disconnected,
    Connected(u64),
    Error,
}

impl Model for TaskReg {
    type Op = RegOp;
    type Ret = RegRet;

    fn step(&self, op: &RegOp) -> (Self, RegRet) {
        match (self, op) {
            (TaskReg::Disconnected, RegOp::Register(i)) => (TaskReg::Connected(*i), RegRet::Ok),
            (TaskReg::Connected(c), RegOp::Register(i)) if c == i => (self.clone(), RegRet::Ok),
            (TaskReg::Connected(_), RegOp::Register(_)) | (TaskReg::Error, RegOp::Register(_)) => {
                (TaskReg::Error, RegRet::Aborted)
            }
            (TaskReg::Disconnected, RegOp::Reset) => (self.clone(), RegRet::FailedPrecondition),
            (_, RegOp::Reset) => (TaskReg::Disconnected, RegRet::Ok),
        }
    }
}

pub fn check_registrations(records: &[RegRecord], budget: usize) -> Vec<String> {
    let entries: Vec<Entry<RegOp, RegRet>> = records
        .iter()
        .map(|r| Entry {
            op: r.op.clone(),
            ret: r.ret.clone(),
            invoke: r.invoke_us,
            complete: r.complete_us,
        })
        .collect();
    match check(TaskReg::Disconnected, &entries, budget) {
        Verdict::Linearizable => Vec::new(),
        Verdict::NotLinearizable { stuck_at } => vec![format!(
            "task registrations break the incarnation rules; no order can place {:?}",
            entries.get(stuck_at)
        )],
        Verdict::Inconclusive => {
            vec!["registration history exceeded the search budget (no verdict)".into()]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(task: i32, counter: i64, invoke: u64, complete: u64, ok: bool) -> BarrierRecord {
        BarrierRecord {
            task,
            barrier: "b".into(),
            counter,
            invoke_us: invoke,
            complete_us: Some(complete),
            outcome: Some(if ok { Ok(()) } else { Err(4) }),
        }
    }

    #[test]
    fn barrier_checks() {
        assert!(check_barriers(&[call(0, 0, 0, 50, true), call(1, 0, 10, 50, true)]).is_empty());
        // Task 0 passed before task 1 arrived.
        assert_eq!(
            check_barriers(&[call(0, 0, 0, 5, true), call(1, 0, 10, 50, true)]).len(),
            1
        );
        // Split outcomes.
        assert_eq!(
            check_barriers(&[call(0, 0, 0, 50, true), call(1, 0, 10, 50, false)]).len(),
            1
        );
    }

    #[test]
    fn registration_rules() {
        let r = |op, ret, invoke, complete| RegRecord {
            op,
            ret: Some(ret),
            invoke_us: invoke,
            complete_us: Some(complete),
        };
        let good = [
            r(RegOp::Register(1), RegRet::Ok, 0, 10),
            r(RegOp::Register(2), RegRet::Aborted, 20, 30),
            r(RegOp::Reset, RegRet::Ok, 40, 50),
            r(RegOp::Register(2), RegRet::Ok, 60, 70),
        ];
        assert!(check_registrations(&good, 10_000).is_empty());
        // A restart accepted without a reset.
        let bad = [
            r(RegOp::Register(1), RegRet::Ok, 0, 10),
            r(RegOp::Register(2), RegRet::Ok, 20, 30),
        ];
        assert_eq!(check_registrations(&bad, 10_000).len(), 1);
    }
}

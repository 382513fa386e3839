//! The crash-consistency loop: load → kill -9 (one random replica, or all three) → restart →
//! verify, over and over on one ensemble whose data keeps growing across cycles.
//!
//! Each cycle's clients insert fresh keys (`crash/<cycle>/<client>/<n>`) and increment one
//! counter, and stop the moment the kill lands, so calls are in flight when the replicas die.
//! After the restart, every acknowledged insert must be there with its value, nothing may be there
//! that nobody tried to insert, and the counter must lie between the increments acknowledged and
//! the increments attempted (all of them, since the first cycle).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use coord_agent::CoordClient;

use super::Endpoints;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::cluster::{Cluster, ClusterOptions};

const COUNTER: &str = "crash/ctr";

#[derive(Clone, Debug)]
pub struct CrashOptions {
    pub cycles: usize,
    pub seed: u64,
    pub clients: usize,
    /// The share of cycles that kill all three replicas (the rest kill one at random).
    pub kill_all_ratio: f64,
    /// The ensemble serves TLS, peers and clients alike.
    pub tls: bool,
}

#[derive(Debug, Default)]
pub struct CrashReport {
    pub cycles: usize,
    pub single_kills: usize,
    pub total_kills: usize,
    pub acked_inserts: usize,
    pub acked_increments: u64,
    /// From the kill to the first verified read, per cycle (worst).
    pub worst_recovery: Duration,
    pub recoveries: Vec<Duration>,
    pub anomalies: Vec<String>,
}

impl CrashReport {
    pub fn summary(&self) -> String {
        let mut r = self.recoveries.clone();
        r.sort();
        let median = r.get(r.len() / 2).copied().unwrap_or_default();
        format!(
            "{} cycles ({} single kills, {} whole-ensemble kills): {} acknowledged inserts and {} increments verified; recovery median {:?}, worst {:?}; {} anomalies",
            self.cycles,
            self.single_kills,
            self.total_kills,
            self.acked_inserts,
            self.acked_increments,
            median,
            self.worst_recovery,
            self.anomalies.len()
        )
    }
}

/// What one cycle's clients did.
#[derive(Default)]
struct Ledger {
    /// key → value, for inserts that were acknowledged.
    acked: Mutex<HashMap<String, String>>,
    /// Keys whose insert was sent (acknowledged or not).
    tried: Mutex<Vec<String>>,
    increments_acked: AtomicU64,
    increments_tried: AtomicU64,
}

fn client(target: &Endpoints) -> CoordClient {
    target.client(Duration::from_secs(30))
}

async fn load(c: CoordClient, cycle: usize, id: usize, ledger: Arc<Ledger>, stop: Arc<AtomicBool>) {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        if n.is_multiple_of(4) {
            ledger.increments_tried.fetch_add(1, Ordering::SeqCst);
            if c.increment(COUNTER, 1).await.is_ok() {
                ledger.increments_acked.fetch_add(1, Ordering::SeqCst);
            }
            continue;
        }
        let key = format!("crash/{cycle}/{id}/{n}");
        let value = format!("v{cycle}.{id}.{n}");
        ledger
            .tried
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(key.clone());
        if c.insert(&key, value.clone(), false).await.is_ok() {
            ledger
                .acked
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key, value);
        }
    }
}

/// Runs the loop on a fresh ensemble.
pub async fn crash_loop(options: &CrashOptions) -> CrashReport {
    let mut rng = StdRng::seed_from_u64(options.seed);
    let mut cluster = Cluster::start(ClusterOptions {
        tls: options.tls,
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let target = Endpoints::of(&cluster, options.tls);
    let mut report = CrashReport::default();
    let (mut increments_acked, mut increments_tried) = (0u64, 0u64);
    for cycle in 0..options.cycles {
        let ledger = Arc::new(Ledger::default());
        let stop = Arc::new(AtomicBool::new(false));
        let tasks: Vec<_> = (0..options.clients)
            .map(|id| {
                tokio::spawn(load(
                    client(&target),
                    cycle,
                    id,
                    ledger.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.gen_range(150..700))).await;

        let all = rng.gen_bool(options.kill_all_ratio.clamp(0.0, 1.0));
        let victims: Vec<u64> = if all {
            cluster.ids()
        } else {
            vec![rng.gen_range(1..=cluster.ids().len() as u64)]
        };
        tokio::task::block_in_place(|| {
            for &id in &victims {
                cluster.kill(id);
            }
        });
        let killed_at = Instant::now();
        // The calls in flight are abandoned: their outcome is unknown.
        stop.store(true, Ordering::Relaxed);
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        if all {
            report.total_kills += 1;
        } else {
            report.single_kills += 1;
        }
        tokio::task::block_in_place(|| {
            for &id in &victims {
                cluster.spawn(id);
            }
        });

        increments_acked += ledger.increments_acked.load(Ordering::SeqCst);
        increments_tried += ledger.increments_tried.load(Ordering::SeqCst);
        let acked =
            std::mem::take(&mut *ledger.acked.lock().unwrap_or_else(PoisonError::into_inner));
        let tried =
            std::mem::take(&mut *ledger.tried.lock().unwrap_or_else(PoisonError::into_inner));
        match verify(
            &target,
            cycle,
            &acked,
            &tried,
            increments_acked,
            increments_tried,
        )
        .await
        {
            Ok(()) => {}
            Err(e) => {
                // Was it lost, or was the read stale? Look again once the ensemble settled.
                let statuses: Vec<String> = cluster
                    .ids()
                    .into_iter()
                    .map(|id| format!("{id}: {:?}", cluster.status(id)))
                    .collect();
                tokio::time::sleep(Duration::from_secs(2)).await;
                let again = verify(
                    &target,
                    cycle,
                    &acked,
                    &tried,
                    increments_acked,
                    increments_tried,
                )
                .await;
                let e = format!(
                    "{e} (read again 2 s later: {}; statuses after the failed read: {statuses:?})",
                    again.err().unwrap_or_else(|| "all there".into())
                );
                let dir = cluster.persist();
                report.anomalies.push(format!(
                    "cycle {cycle} (killed {victims:?}): {e}; data and logs kept in {}",
                    dir.display()
                ));
                break;
            }
        }
        let recovery = killed_at.elapsed();
        report.worst_recovery = report.worst_recovery.max(recovery);
        report.recoveries.push(recovery);
        report.acked_inserts += acked.len();
        report.cycles += 1;
        // A long loop shows where it is.
        if report.cycles % 25 == 0 {
            eprintln!(
                "crash loop: {}/{} cycles, {} inserts verified, worst recovery {:?}",
                report.cycles, options.cycles, report.acked_inserts, report.worst_recovery
            );
        }
    }
    report.acked_increments = increments_acked;
    for id in cluster.ids() {
        if cluster.log(id).contains("panicked") {
            report
                .anomalies
                .push(format!("replica {id} panicked (see its log)"));
        }
    }
    report
}

async fn verify(
    target: &Endpoints,
    cycle: usize,
    acked: &HashMap<String, String>,
    tried: &[String],
    increments_acked: u64,
    increments_tried: u64,
) -> Result<(), String> {
    let c = client(target);
    let present = c
        .get_dir(&format!("crash/{cycle}/"))
        .await
        .map_err(|e| format!("reading the cycle's keys after the restart failed: {e}"))?;
    let present: HashMap<String, String> = present
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).to_string()))
        .collect();
    let mut missing: Vec<&String> = Vec::new();
    for (key, value) in acked {
        match present.get(key) {
            Some(v) if v == value => {}
            Some(v) => {
                return Err(format!(
                    "acknowledged insert {key:?}={value:?} reads back as {v:?}"
                ))
            }
            None => missing.push(key),
        }
    }
    if !missing.is_empty() {
        missing.sort();
        return Err(format!(
            "{} of {} acknowledged inserts are missing ({} keys of the cycle present), e.g. {:?}",
            missing.len(),
            acked.len(),
            present.len(),
            &missing[..missing.len().min(5)]
        ));
    }
    if let Some(k) = present.keys().find(|k| !tried.contains(k)) {
        return Err(format!("key {k:?} exists but nobody inserted it"));
    }
    let counter = match c
        .try_get(COUNTER)
        .await
        .map_err(|e| format!("reading {COUNTER:?} failed: {e}"))?
    {
        None => 0,
        Some(v) => String::from_utf8_lossy(&v)
            .parse::<u64>()
            .map_err(|e| format!("{COUNTER:?} is not a number: {e}"))?,
    };
    if counter < increments_acked || counter > increments_tried {
        return Err(format!(
            "{COUNTER:?} is {counter}, but {increments_acked} increments were acknowledged and {increments_tried} attempted"
        ));
    }
    Ok(())
}

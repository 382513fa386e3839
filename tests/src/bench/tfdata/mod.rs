//! `coord-bench tfdata`: coord's `tensorflow.data.DispatcherService` (3 replicas behind
//! coord-proxy) against TensorFlow's own `DispatchServer` (`fault_tolerant_mode=True`: every
//! update journaled), with real TensorFlow on both sides in the same run
//! (`tests/tfdata/tf_bench.py`).
//!
//! - **Throughput**: the same `WorkerServer`s (W per system, spread over a few processes that each
//!   host their share of both systems' workers) and one reader process, outside the workers'
//!   processes so that elements travel over gRPC, read `range(N)` with
//!   `distribute(processing_mode="distributed_epoch")`: one split per element, each handed out by
//!   the dispatcher. Elements/s from the first batch to the last, after an untimed warm-up, every
//!   element checked to come exactly once. The systems alternate round after round and medians
//!   are reported, so that drift in this shared machine's speed hits both alike. More rows:
//!   `range(N).batch(256)`, batched on the workers before `distribute` (the reader fetches
//!   batches, and each of their elements is one split: the dispatcher's largest share), heavier
//!   elements (vectors of some KiB), and the ceiling with no dispatcher in the element path (OFF
//!   sharding). The CPU each process spent per element, and what coord's leader did meanwhile
//!   (its `/metrics`), say where the time went, for each DYNAMIC workload.
//! - **Outage**: a fake worker calls GetSplit back to back (raw RPCs, a real job and iteration
//!   with a heartbeating client) and timestamps each answer; the dispatcher is killed (`kill -9`)
//!   and the figure is the time from the kill to the answer that ended the fake worker's longest
//!   wait after it (answers already on their way, or splits coord-proxy holds, come first).
//!   TF: its process is restarted on the same journal (TF's import included), or, alternately, a
//!   standby process with TF imported builds the `DispatchServer` the moment the kill happens
//!   (TF's best case).
//!   coord: the leader replica is killed; the fake worker talks to coord-proxy, which re-drives
//!   the call on the next leader.
//!
//! Modules, bottom up:
//!
//! - `harness`: the flags, coord's ensemble and coord-proxy, `/metrics`, CPU seconds.
//! - [`script`]: one process of `tf_bench.py` and its JSON events (TF's dispatcher among them).
//! - [`throughput`]: the alternating throughput rounds.
//! - [`outage`]: the kill-to-next-split measurements.
//!
//! This module runs them and prints the report.

mod harness;
mod outage;
mod script;
mod throughput;

pub use harness::Args;

use std::path::PathBuf;

use outage::{coord_outages, tf_outages, Outages};
use throughput::Row;

fn median(v: &[f64]) -> Option<f64> {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    (n > 0).then(|| (v[(n - 1) / 2] + v[n / 2]) / 2.0)
}

/// `v` shown with `f`, or a dash.
fn show(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "–".to_string(), f)
}

fn yes_no(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "**no**",
        None => "–",
    }
}

fn print_throughput(args: &Args, rows: &[Row]) {
    println!(
        "\n| tf.data service, DYNAMIC sharding, TF's own workers and reader (median of {} rounds) | coord elements/s | TF elements/s | coord / TF | target | met | coord / TF had coord's dispatcher path cost nothing |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (c, t) = (median(&r.coord), median(&r.tf));
        let x = c.zip(t).map(|(c, t)| c / t);
        let (target, met) = match r.headline {
            true => ("≥ 2×", yes_no(x.map(|x| x >= 2.0))),
            false => ("", ""),
        };
        let free = r.free_dispatcher.zip(t).map(|(f, t)| f / t);
        let (c, t) = (
            show(c, |v| format!("{v:.0}")),
            show(t, |v| format!("{v:.0}")),
        );
        let (x, free) = (
            show(x, |v| format!("{v:.2}×")),
            show(free, |v| format!("{v:.2}×")),
        );
        println!(
            "| {} | {c} | {t} | {x} | {target} | {met} | {free} |",
            r.label
        );
    }
    println!(
        "\nThe last column: the elements/s coord would read with the same cores busy, all spent by \
         TensorFlow's workers and reader (at the CPU per element they spent under coord), over \
         TF's; no dispatcher can do better on this machine while the reads are CPU-bound (the \
         cores busy are printed with the CPU per element)."
    );
}

fn print_outages(args: &Args, out: &Outages) {
    let c = median(&out.coord);
    println!(
        "\n| dispatcher kill -9 → next split at the worker (median of {} kills each) | seconds | coord / this | target | met |",
        args.kills
    );
    println!("|---|---:|---:|---:|---:|");
    let secs = |v: Option<f64>| show(v, |v| format!("{v:.3} s"));
    println!(
        "| coord: leader replica killed, GetSplit through coord-proxy (a new leader served after {}) | {} | | ≤ 0.5 s | {} |",
        secs(median(&out.coord_elected)),
        secs(c),
        yes_no(c.map(|c| c <= 0.5))
    );
    let restart = "TF: DispatchServer's process restarted on its journal (TF's import included)";
    let standby = "TF: pre-imported standby builds the DispatchServer at the kill (TF's best case)";
    for (what, t) in [(restart, &out.tf_restart), (standby, &out.tf_standby)] {
        let x = c.zip(median(t)).map(|(c, t)| c / t);
        let (t, met) = (secs(median(t)), yes_no(x.map(|x| x <= 0.2)));
        let x = show(x, |v| format!("{v:.2}"));
        println!("| {what} | {t} | {x} | ≤ 0.2 | {met} |");
    }
    let ms = |v: &[f64]| show(median(v), |v| format!("{v:.2} ms"));
    println!(
        "| GetSplit round trip p50, one caller, no kill: coord via coord-proxy / coord's leader direct / TF | {} / {} / {} | | | |",
        ms(&out.coord_p50),
        ms(&out.coord_direct_p50),
        ms(&out.tf_p50)
    );
    match out.lost.is_empty() {
        true => println!(
            "\nNo split was lost across any kill: each outage's next split was the next one."
        ),
        false => println!("\nSplits lost across kills: {}", out.lost.join(", ")),
    }
}

pub async fn run(args: Args) -> Result<(), String> {
    eprintln!("coord-bench tfdata: preparing TensorFlow (a venv, once)");
    let python: PathBuf = tokio::task::spawn_blocking(crate::tfdata::tf_python)
        .await
        .map_err(|e| e.to_string())??;
    let mut rows = Vec::new();
    for &w in args.workers.iter().filter(|&&w| w > 0) {
        eprintln!("coord-bench tfdata: throughput, {w} workers");
        rows.extend(throughput::throughput(&python, &args, w).await?);
    }
    let mut out = Outages::default();
    if args.kills > 0 {
        eprintln!(
            "coord-bench tfdata: TF's dispatcher killed {}×",
            2 * args.kills
        );
        tf_outages(&python, &args, &mut out).await?;
        eprintln!("coord-bench tfdata: coord's leader killed {}×", args.kills);
        coord_outages(&python, &args, &mut out).await?;
    }
    if !rows.is_empty() {
        print_throughput(&args, &rows);
    }
    if args.kills > 0 {
        print_outages(&args, &out);
    }
    Ok(())
}

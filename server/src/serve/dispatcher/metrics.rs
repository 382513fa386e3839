//! The dispatcher's part of `/metrics`: jobs, workers, splits and journal updates, from this
//! replica's applied state (every replica reports the same numbers once caught up).

use std::fmt::Write;

use coord_raft_store::dispatcher::{DispatcherState, Mode};

use crate::ops::metrics::{counter, header};

pub fn write(out: &mut String, s: &DispatcherState) {
    let finished = s.jobs.values().filter(|j| j.finished).count();
    header(
        out,
        "coord_dispatcher_jobs",
        "gauge",
        "tf.data jobs by state.",
    );
    let _ = writeln!(
        out,
        "coord_dispatcher_jobs{{state=\"active\"}} {}\ncoord_dispatcher_jobs{{state=\"finished\"}} {finished}",
        s.jobs.len() - finished
    );
    let alive = s.workers.values().filter(|w| w.alive).count();
    header(
        out,
        "coord_dispatcher_workers",
        "gauge",
        "Data workers by state.",
    );
    let _ = writeln!(
        out,
        "coord_dispatcher_workers{{state=\"alive\"}} {alive}\ncoord_dispatcher_workers{{state=\"dead\"}} {}",
        s.workers.len() - alive
    );
    let dynamic = || s.jobs.values().filter(|j| j.mode == Mode::Dynamic);
    header(
        out,
        "coord_dispatcher_splits_total",
        "counter",
        "DYNAMIC splits: handed out (first time), delivered, re-issued after their worker died.",
    );
    let _ = writeln!(
        out,
        "coord_dispatcher_splits_total{{kind=\"handed_out\"}} {}\ncoord_dispatcher_splits_total{{kind=\"delivered\"}} {}\ncoord_dispatcher_splits_total{{kind=\"reissued\"}} {}",
        dynamic().map(|j| j.splits.next).sum::<u64>(),
        dynamic().map(|j| j.splits.delivered).sum::<u64>(),
        dynamic().map(|j| j.splits.reissued).sum::<u64>(),
    );
    header(
        out,
        "coord_dispatcher_leased_splits",
        "gauge",
        "DYNAMIC splits leased to a task and not yet delivered.",
    );
    let _ = writeln!(
        out,
        "coord_dispatcher_leased_splits {}",
        dynamic().map(|j| j.splits.leased.len()).sum::<usize>()
    );
    counter(
        out,
        "coord_dispatcher_updates_total",
        "Dispatcher updates applied (journal entries that changed the state).",
        s.updates,
    );
}

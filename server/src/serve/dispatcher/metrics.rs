//! The dispatcher's part of `/metrics`, from this replica's applied state (every replica reports
//! the same numbers once caught up): `coord_dispatcher_*` counts the whole dispatcher, both
//! surfaces together; `coord_tfdata_*` the part of it TensorFlow's surface serves (iterations of
//! TensorFlow's graphs, TensorFlow's workers).

use std::fmt::Write;

use coord_raft_store::dispatcher::DispatcherState;

use crate::ops::metrics::{counter, header};

fn gauge_pair(out: &mut String, name: &str, help: &str, labels: [(&str, usize); 2]) {
    header(out, name, "gauge", help);
    for (state, n) in labels {
        let _ = writeln!(out, "{name}{{state=\"{state}\"}} {n}");
    }
}

pub fn write(out: &mut String, s: &DispatcherState) {
    let finished = s.iterations.values().filter(|it| it.finished).count();
    gauge_pair(
        out,
        "coord_dispatcher_jobs",
        "tf.data iterations (a job's repetitions; a coord job is one) by state.",
        [
            ("active", s.iterations.len() - finished),
            ("finished", finished),
        ],
    );
    let lost = s.workers.values().filter(|w| w.lost).count();
    gauge_pair(
        out,
        "coord_dispatcher_workers",
        "Data workers by state (dead: silent past their worker timeout).",
        [("alive", s.workers.len() - lost), ("dead", lost)],
    );
    let leases = || {
        s.iterations
            .values()
            .flat_map(|it| it.providers.iter().flatten())
            .filter_map(|p| p.leases.as_ref())
    };
    header(
        out,
        "coord_dispatcher_splits_total",
        "counter",
        "DYNAMIC splits: handed out (first time), delivered, re-issued after their worker died.",
    );
    let _ = writeln!(
        out,
        "coord_dispatcher_splits_total{{kind=\"handed_out\"}} {}\ncoord_dispatcher_splits_total{{kind=\"delivered\"}} {}\ncoord_dispatcher_splits_total{{kind=\"reissued\"}} {}",
        s.splits_handed_out,
        leases().map(|l| l.delivered).sum::<u64>(),
        leases().map(|l| l.reissued).sum::<u64>(),
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
        leases().map(|l| l.leased.len()).sum::<usize>()
    );
    counter(
        out,
        "coord_dispatcher_updates_total",
        "Dispatcher updates applied (journal entries that changed the state).",
        s.updates,
    );
    write_tensorflow_part(out, s);
}

fn write_tensorflow_part(out: &mut String, s: &DispatcherState) {
    let iterations: Vec<_> = s
        .iterations
        .values()
        .filter(|it| !s.reads_definition(it))
        .collect();
    let finished = iterations.iter().filter(|it| it.finished).count();
    gauge_pair(
        out,
        "coord_tfdata_iterations",
        "TensorFlow tf.data iterations (job repetitions) by state.",
        [
            ("active", iterations.len() - finished),
            ("finished", finished),
        ],
    );
    let workers: Vec<_> = s.workers.values().filter(|w| !w.reports_delivery).collect();
    let lost = workers.iter().filter(|w| w.lost).count();
    gauge_pair(
        out,
        "coord_tfdata_workers",
        "TensorFlow tf.data workers: present, or lost (silent past the worker timeout).",
        [("present", workers.len() - lost), ("lost", lost)],
    );
    let to_definitions: u64 = s
        .iterations
        .values()
        .flat_map(|it| it.providers.iter().flatten())
        .filter(|p| p.leases.is_some())
        .map(|p| p.index)
        .sum();
    counter(
        out,
        "coord_tfdata_splits_total",
        "DYNAMIC splits handed out to TensorFlow's workers.",
        s.splits_handed_out.saturating_sub(to_definitions),
    );
}

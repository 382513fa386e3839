//! TensorFlow's tf.data dispatcher on `/metrics`, from this replica's applied state (every
//! replica reports the same numbers once caught up).

use std::fmt::Write;

use coord_raft_store::tfdata::TfDataState;

use crate::ops::metrics::{counter, header};

pub fn write(out: &mut String, s: &TfDataState) {
    let finished = s.iterations.values().filter(|it| it.finished).count();
    header(
        out,
        "coord_tfdata_iterations",
        "gauge",
        "TensorFlow tf.data iterations (job repetitions) by state.",
    );
    let _ = writeln!(
        out,
        "coord_tfdata_iterations{{state=\"active\"}} {}\ncoord_tfdata_iterations{{state=\"finished\"}} {finished}",
        s.iterations.len() - finished
    );
    let lost = s.workers.values().filter(|w| w.lost).count();
    header(
        out,
        "coord_tfdata_workers",
        "gauge",
        "TensorFlow tf.data workers: present, or lost (silent past the worker timeout).",
    );
    let _ = writeln!(
        out,
        "coord_tfdata_workers{{state=\"present\"}} {}\ncoord_tfdata_workers{{state=\"lost\"}} {lost}",
        s.workers.len() - lost
    );
    counter(
        out,
        "coord_tfdata_splits_total",
        "DYNAMIC splits handed out to TensorFlow's workers.",
        s.splits_handed_out,
    );
    counter(
        out,
        "coord_tfdata_updates_total",
        "Updates of TensorFlow's tf.data dispatcher applied (journal entries that changed it).",
        s.updates,
    );
}

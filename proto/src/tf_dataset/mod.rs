//! The split providers TensorFlow 2.21's tf.data dispatcher makes for a dataset graph, derived
//! from the `GraphDef` alone, with no TensorFlow.
//!
//! Under dynamic sharding ("distributed_epoch") TF's dispatcher instantiates the client's
//! `DatasetDef` (`standalone::Dataset::FromGraph`: it runs the graph up to the input of its last
//! `_Retval` node) and calls `MakeSplitProviders` on the result; workers then fetch split `i` of
//! provider `p` with `GetSplit`. coord's dispatcher has no TF runtime, so [`split_sources`] walks
//! the graph the way `DatasetBase::MakeSplitProviders` (framework/dataset.cc) walks datasets:
//!
//! - a source with a split provider of its own ends the walk with one provider:
//!   `RangeDataset` hands out the range's values (`RangeSplitProvider`, range_dataset_op.cc);
//!   `TensorSliceDataset`, `TensorDataset`, `ListDataset` and `RandomDataset` hand out indexes
//!   `0..n` (`IndexSplitProvider`, data/split_utils.cc) — so for `list_files` and the file
//!   readers only the *number* of files matters, never their names;
//! - a unary dataset (map, batch, interleave, flat_map...) delegates to its input dataset (the
//!   datasets inside its functions never count);
//! - `ZipDataset`, `ConcatenateDataset` and `DirectedInterleaveDataset` concatenate their inputs'
//!   providers in input order (`GetSplitProviders`, split_utils.cc);
//! - anything else is a [`Refusal`] naming the op: what TF refuses too (a file reader with no
//!   provider of its own, snapshot, group_by_reducer...) and every op coord does not know.
//!
//! Two consequences that look odd but are TF's: `from_generator` (a `TensorDataset` under a
//! `flat_map`) gets one split, like `from_tensors`, and works with TF when the worker shares the
//! client's process; `enumerate`, `sample_from_datasets` and `Dataset.random` add a provider
//! (a range to int64's max, or `RandomDataset`'s 2^63-1 indexes) that never ends in practice.
//! coord refuses two things TF accepts: a range whose counter would step past int64 (TF's wraps
//! around), and a source fed by a tensor that is not a constant (TF would run the op).
//!
//! The invariant this module keeps: for every graph it accepts, [`SplitSource::split`] is exactly
//! the `TensorProto` TF 2.21's dispatcher answers to `GetSplit`, for every index of every
//! repetition (TF resets a provider at its end, so each repetition repeats the same splits). The
//! fixtures under `proto/tests/fixtures/tf_datasets/` are TF's own answers
//! (`tests/tfdata/capture_split_fixtures.py`); the tests hold this module up against them.
//!
//! What TF 2.21 clients actually send: every tensor a dataset holds is serialized as a `Const`
//! (`AsGraphDef` of the live dataset), so a `list_files` or `TFRecordDataset([...])` graph carries
//! its file names as a constant string vector, and the only wrapper the client adds is the
//! `ParallelMapDatasetV2` that compresses elements. A graph built by hand (graph mode) can still
//! carry `MatchingFiles`; it is evaluated through the `glob` callback, so this module stays free
//! of I/O ([`local_matching_paths`] is the local-filesystem glob the server passes in).

mod glob;
mod graph;
mod ops;
mod tensor;
mod walk;

#[cfg(test)]
mod tests;

pub use glob::local_matching_paths;

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::tensorflow::data::DatasetDef;
use crate::tensorflow::TensorProto;

/// One split provider of a dataset, as TF 2.21's dispatcher makes it. Small and plain: the
/// replicated state stores a job's `Vec<SplitSource>` and hands out split `i` as a pure function
/// of it, so a split handed out again after a failover is the same split.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SplitSource {
    /// `RangeSplitProvider`: split `i` is the value `start + i * step` (an int64 scalar), for
    /// every value of `range(start, stop, step)`. `split_sources` only makes ranges whose values
    /// and the step past the last one stay within int64 (TF's counter wraps around past that).
    Range { start: i64, stop: i64, step: i64 },
    /// `IndexSplitProvider(n)`: split `i` is `i` (an int64 scalar), for `i` in `0..n`.
    Index { n: u64 },
}

impl SplitSource {
    /// The number of splits the provider hands out per repetition, before `end_of_splits`.
    pub fn count(&self) -> u64 {
        match *self {
            SplitSource::Range { start, stop, step } => range_count(start, stop, step),
            SplitSource::Index { n } => n,
        }
    }

    /// Split `i`, exactly the `TensorProto` TF sends in `GetSplitResponse.split`; `None` past the
    /// end (TF answers `end_of_splits` there).
    pub fn split(&self, i: u64) -> Option<TensorProto> {
        if i >= self.count() {
            return None;
        }
        let value = match *self {
            // In range: `start + i * step` lies between start and stop.
            SplitSource::Range { start, step, .. } => {
                i64::try_from(i128::from(start) + i128::from(i) * i128::from(step)).ok()?
            }
            SplitSource::Index { .. } => i64::try_from(i).ok()?,
        };
        Some(tensor::int64_scalar(value))
    }
}

/// The number of values of `range(start, stop, step)`; 0 for step 0 (which TF refuses).
fn range_count(start: i64, stop: i64, step: i64) -> u64 {
    let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
    let n = if step > 0 && start < stop {
        (stop - start - 1) / step + 1
    } else if step < 0 && start > stop {
        (start - stop - 1) / -step + 1
    } else {
        0
    };
    // At most 2^64 - 1: the span of int64.
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Why a dataset graph gets no split providers: the op (and node) at fault, and why. TF's own
/// refusals name the dataset type the same way ("Cannot create split providers for dataset of
/// type TFRecordDataset...").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The op type of the node at fault (`TFRecordDataset`, `_Retval`...).
    pub op: String,
    /// The node's name in the graph; empty when no node is at fault (no `_Retval` at all).
    pub node: String,
    pub reason: String,
}

impl Refusal {
    fn new(op: &str, node: &str, reason: impl Into<String>) -> Self {
        Refusal {
            op: op.to_owned(),
            node: node.to_owned(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.node.is_empty() {
            write!(f, "no split providers: op {}: {}", self.op, self.reason)
        } else {
            write!(
                f,
                "no split providers: op {} (node \"{}\"): {}",
                self.op, self.node, self.reason
            )
        }
    }
}

impl std::error::Error for Refusal {}

/// Glob callback: the sorted matches of one pattern, with TF's `GetMatchingPaths` semantics.
pub type Glob<'a> = &'a dyn Fn(&str) -> Result<Vec<String>, String>;

/// The split providers TF 2.21's dispatcher makes for `def` under dynamic sharding, in
/// `split_provider_index` order, or why it makes none. `glob` evaluates `MatchingFiles` nodes
/// (only hand-built graphs have them; pass [`local_matching_paths`] to read the local
/// filesystem as TF's dispatcher would).
///
/// ```
/// use coord_proto::tensorflow::data::DatasetDef;
/// use coord_proto::tf_dataset::{local_matching_paths, split_sources};
///
/// let refusal = split_sources(&DatasetDef::default(), &local_matching_paths).unwrap_err();
/// assert_eq!(refusal.op, "_Retval");
/// ```
pub fn split_sources(def: &DatasetDef, glob: Glob<'_>) -> Result<Vec<SplitSource>, Refusal> {
    let Some(graph) = def.graph.as_ref() else {
        return Err(Refusal::new("_Retval", "", "the DatasetDef has no graph"));
    };
    let graph = graph::Graph::new(graph)?;
    let root = graph.root()?;
    walk::Walk::new(&graph, glob).providers_of(root)
}

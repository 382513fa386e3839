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
//!
//! Its modules, bottom up: `refusal` ([`Refusal`]); `glob` (the [`Glob`] callback, and TF's
//! local-filesystem glob); `ops` (which role each dataset op plays); `graph` (a `GraphDef`'s
//! nodes by name, and the root); `tensor` (a source's input tensors, evaluated); `source`
//! ([`SplitSource`] and its splits); `walk` (`MakeSplitProviders`' walk). This module only
//! declares them and starts the walk ([`split_sources`]).

mod glob;
mod graph;
mod ops;
mod refusal;
mod source;
mod tensor;
mod walk;

#[cfg(test)]
mod tests;

pub use glob::{local_matching_paths, Glob};
pub use refusal::Refusal;
pub use source::SplitSource;

use crate::tensorflow::data::DatasetDef;

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

//! What each dataset op contributes to `MakeSplitProviders` in TF 2.21: the table the walk
//! follows. An op that makes or passes on providers is listed only when TF's source says so *and*
//! a captured fixture shows TF's dispatcher doing it (`tests/tfdata/capture_split_fixtures.py`):
//! a unary op TF cannot walk through (one that implements neither `InputDatasets` nor
//! `MakeSplitProviders`, like `ExperimentalGroupByReducerDataset`) looks exactly like one it can
//! in a graph, so guessing would hand out splits where TF refuses. Ops not listed are refused;
//! the refused ones listed only get TF's reason.

/// An op's part in the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// `RangeDataset`: one `RangeSplitProvider` (range_dataset_op.cc).
    Range,
    /// `TensorSliceDataset`: `IndexSplitProvider(first dimension of component 0)`
    /// (tensor_slice_dataset_op.cc).
    TensorSlices,
    /// `TensorDataset` (`from_tensors`): `IndexSplitProvider(1)` (tensor_dataset_op.cc).
    Tensor,
    /// `ListDataset` (`experimental.from_list`): `IndexSplitProvider(inputs / components)`
    /// (experimental/list_dataset_op.cc).
    List,
    /// `RandomDataset`: `IndexSplitProvider(kint64max)`, splits nobody reads
    /// (experimental/random_dataset_op.cc).
    Random,
    /// `DatasetBase::MakeSplitProviders`' default: the one input dataset's providers.
    Unary,
    /// `GetSplitProviders`: every input dataset's providers, in input order (zip,
    /// concatenate, directed_interleave).
    AllInputs,
    /// TF refuses: the reason, in TF's words where it has some.
    Refused(&'static str),
    /// Not in the table.
    Unknown,
}

/// Arity-0 datasets without a split provider of their own: TF's default `MakeSplitProviders`
/// fails with "not unary (instead having arity 0)". The readers come here when used alone; the
/// public `TFRecordDataset([...])` etc. wrap them in `from_tensor_slices(files).flat_map(...)`.
const NO_PROVIDER_SOURCE: &str = "a source dataset with no split provider of its own (TF: \
     \"the dataset is not unary (instead having arity 0), and no custom implementation of \
     `MakeSplitProvider` is defined\")";

/// The role of op type `op`.
pub(super) fn role(op: &str) -> Role {
    match op {
        "RangeDataset" => Role::Range,
        "TensorSliceDataset" => Role::TensorSlices,
        "TensorDataset" => Role::Tensor,
        "ListDataset" => Role::List,
        "RandomDataset" => Role::Random,
        "ZipDataset" | "ConcatenateDataset" | "DirectedInterleaveDataset" => Role::AllInputs,
        // Every one seen delegating in TF 2.21's answers (the fixtures).
        "AssertCardinalityDataset"
        | "BatchDatasetV2"
        | "CacheDatasetV2"
        | "DenseToSparseBatchDataset"
        | "FilterDataset"
        | "FlatMapDataset"
        | "GroupByWindowDataset"
        | "IgnoreErrorsDataset"
        | "InterleaveDataset"
        | "LegacyParallelInterleaveDatasetV2"
        | "MapAndBatchDataset"
        | "MapDataset"
        | "OptionsDataset"
        | "PaddedBatchDatasetV2"
        | "ParallelBatchDataset"
        | "ParallelInterleaveDatasetV4"
        | "ParallelMapDatasetV2"
        | "PrefetchDataset"
        | "RebatchDatasetV2"
        | "RepeatDataset"
        | "ScanDataset"
        | "ShardDataset"
        | "ShuffleDatasetV3"
        | "SkipDataset"
        | "TakeDataset"
        | "TakeWhileDataset"
        | "UnbatchDataset"
        | "UniqueDataset"
        | "WindowDataset" => Role::Unary,
        "SnapshotDatasetV2" => {
            Role::Refused("TF: \"Splitting is not implemented for snapshot datasets.\"")
        }
        "ExperimentalGroupByReducerDataset" => Role::Refused(
            "TF: \"Cannot create split providers for dataset of type \
             ExperimentalGroupByReducerDataset, because the dataset implements neither \
             `InputDatasets` nor `MakeSplitProvider`.\"",
        ),
        "TFRecordDataset"
        | "TFRecordDatasetV2"
        | "TextLineDataset"
        | "FixedLengthRecordDatasetV2"
        | "CSVDatasetV2" => Role::Refused(NO_PROVIDER_SOURCE),
        _ => Role::Unknown,
    }
}

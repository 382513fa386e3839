//! [`SplitSource`]: one split provider of a dataset, as TF 2.21's dispatcher makes it, and split
//! `i` as a pure function of it — so a split handed out again after a failover is the same split.

use serde::{Deserialize, Serialize};

use super::tensor;
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
pub(super) fn range_count(start: i64, stop: i64, step: i64) -> u64 {
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

//! DYNAMIC sharding ("distributed epoch"): GetSplit hands out a provider's splits in order, one
//! repetition after another.
//!
//! A worker asks for the next split of (iteration, repetition, provider); coord-proxy may ask
//! for several at once (a lease it hands out to its host's workers, one per GetSplit). A provider is a
//! position, (repetition, index), over a known number of splits per repetition: split `index` is
//! handed out and the index advances; past the last split the answer is end-of-splits and the
//! provider moves to the next repetition (a worker that repeats its input asks for it). A request
//! for a repetition already over answers end-of-splits and changes nothing; one for a later
//! repetition (an input repeated before it ended, e.g. the longer side of a `zip`) starts that
//! repetition, as TensorFlow resets its provider then. Every split handed out is an applied op,
//! so a new leader never hands it out again, and a retried GetSplit (same request id) is answered
//! from the session table with the split it was first given.

use super::jobs::iteration_not_found;
use super::{status, TfDataOutput, TfDataState};
use crate::error::{Code, OpError};

impl TfDataState {
    pub(super) fn get_split(
        &mut self,
        iteration: i64,
        repetition: i64,
        provider: i64,
        max: u64,
    ) -> Result<TfDataOutput, OpError> {
        let it = self
            .iterations
            .get_mut(&iteration)
            .ok_or_else(|| iteration_not_found(iteration))?;
        let Some(providers) = it.providers.as_mut() else {
            return Err(status(
                Code::FailedPrecondition,
                format!(
                    "Cannot get split for iteration {iteration}, since it is not a \
                     distributed_epoch iteration."
                ),
            ));
        };
        let count = providers.len();
        let p = usize::try_from(provider)
            .ok()
            .and_then(|i| providers.get_mut(i))
            .ok_or_else(|| {
                status(
                    Code::InvalidArgument,
                    format!(
                        "split provider index {provider} is out of range: iteration \
                         {iteration} has {count} split providers"
                    ),
                )
            })?;
        let end = TfDataOutput::Splits { from: 0, count: 0 };
        if repetition < p.repetition {
            return Ok(end);
        }
        if repetition > p.repetition {
            p.repetition = repetition;
            p.index = 0;
        }
        if p.index < p.splits {
            let (from, count) = (p.index, (p.splits - p.index).min(max.max(1)));
            p.index += count;
            self.splits_handed_out += count;
            Ok(TfDataOutput::Splits { from, count })
        } else {
            p.repetition += 1;
            p.index = 0;
            Ok(end)
        }
    }
}

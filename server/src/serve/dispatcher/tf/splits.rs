//! DYNAMIC sharding's split providers, worked out by the leader from the dataset's graph before
//! it proposes an iteration, and turned back into TensorFlow's split tensors when GetSplit hands
//! split `i` out.
//!
//! The graph analysis is `coord_proto::tf_dataset`'s (which sources make which providers, through
//! which ops); `MatchingFiles` (`Dataset.list_files`) is evaluated on this replica's filesystem,
//! as TensorFlow's dispatcher evaluates it on its own. The replicated state keeps each provider as
//! an opaque spec (the [`SplitSource`], JSON) and its split count.

use coord_proto::tensorflow::data::{self as pb, DatasetDef};
use coord_proto::tensorflow::TensorProto;
use coord_proto::tf_dataset::{split_sources, SplitSource};
use coord_raft_store::dispatcher::{DispatcherOp, DispatcherOutput, DispatcherState, ProviderSpec};
use coord_raft_store::{Output, RequestId};
use prost::Message;

use super::{unexpected, DispatcherCore};
use crate::error::CoordError;

impl DispatcherCore {
    /// The split providers of dataset `dataset` under DYNAMIC sharding (see [`providers`]).
    pub(super) async fn dynamic_providers(
        &self,
        dataset: &str,
    ) -> Result<Vec<ProviderSpec>, CoordError> {
        let def = self.graph(dataset).await?;
        providers(dataset, &def)
    }

    /// TF's GetSplit: one split.
    pub async fn get_split(
        &self,
        id: Option<RequestId>,
        req: pb::GetSplitRequest,
    ) -> Result<pb::GetSplitResponse, CoordError> {
        let at = SplitRequest {
            iteration: req.iteration_id,
            repetition: req.repetition,
            provider: req.split_provider_index,
        };
        let split = self.get_splits(id, at, 1).await?.into_iter().next();
        Ok(pb::GetSplitResponse {
            end_of_splits: split.is_none(),
            split,
        })
    }

    /// Up to `max` next splits of a provider, in order, as TensorFlow sends them; none: the
    /// repetition is over (end of splits). Every split returned is journaled before it is.
    pub async fn get_splits(
        &self,
        id: Option<RequestId>,
        at: SplitRequest,
        max: u64,
    ) -> Result<Vec<TensorProto>, CoordError> {
        let provider = |s: &DispatcherState| {
            let p = usize::try_from(at.provider).ok()?;
            s.iterations
                .get(&at.iteration)?
                .providers
                .as_ref()?
                .get(p)
                .cloned()
        };
        // A repetition that is over stays over: the applied state may lag the log, never lead
        // it, so this needs neither a write nor a read barrier (workers ask again and again once
        // their input ended).
        if self
            .applied(provider)
            .is_some_and(|p| at.repetition < p.repetition)
        {
            return Ok(Vec::new());
        }
        let op = DispatcherOp::GetSplit {
            iteration: at.iteration,
            repetition: at.repetition,
            provider: at.provider,
            max,
        };
        let (from, count) = match self.commit(id, op).await? {
            DispatcherOutput::Splits { from, count } => (from, count),
            other => return Err(unexpected("get_split", &Output::Dispatcher(other))),
        };
        if count == 0 {
            return Ok(Vec::new());
        }
        let spec = self.applied(provider).map(|p| p.spec).ok_or_else(|| {
            CoordError::Internal(format!(
                "iteration {} handed out splits of provider {} and lost it",
                at.iteration, at.provider
            ))
        })?;
        (from..from + count).map(|i| split(&spec, i)).collect()
    }
}

/// Which provider's splits, of which repetition.
#[derive(Clone, Copy, Debug)]
pub struct SplitRequest {
    pub iteration: i64,
    pub repetition: i64,
    pub provider: i64,
}

/// The split providers TensorFlow's dispatcher would make for the dataset `def` (encoded
/// `DatasetDef`); a dataset whose splits cannot be produced is refused FAILED_PRECONDITION naming
/// the op.
pub fn providers(dataset_id: &str, def: &[u8]) -> Result<Vec<ProviderSpec>, CoordError> {
    let def = DatasetDef::decode(def).map_err(|e| {
        CoordError::Internal(format!("stored dataset {dataset_id} does not decode: {e}"))
    })?;
    let sources =
        split_sources(&def, &coord_proto::tf_dataset::local_matching_paths).map_err(|r| {
            CoordError::status(
                coord_raft_store::state::Code::FailedPrecondition,
                format!(
                "dataset {dataset_id} cannot be sharded dynamically (processing mode DYNAMIC): \
                 {r}"
            ),
            )
        })?;
    sources
        .iter()
        .map(|s| {
            Ok(ProviderSpec {
                spec: serde_json::to_vec(s)
                    .map_err(|e| CoordError::Internal(format!("split source: {e}")))?
                    .into(),
                splits: s.count(),
            })
        })
        .collect()
}

/// Split `index` of the provider `spec`, as TensorFlow sends it.
pub fn split(spec: &[u8], index: u64) -> Result<TensorProto, CoordError> {
    let source: SplitSource = serde_json::from_slice(spec)
        .map_err(|e| CoordError::Internal(format!("stored split provider does not decode: {e}")))?;
    source.split(index).ok_or_else(|| {
        CoordError::Internal(format!(
            "split {index} is past the end of its provider ({} splits)",
            source.count()
        ))
    })
}

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
use coord_raft_store::tfdata::{ProviderSpec, TfDataOp, TfDataOutput};
use coord_raft_store::{Output, RequestId};
use prost::Message;

use super::{unexpected, TfDataCore};
use crate::error::CoordError;

impl TfDataCore {
    /// The split providers of dataset `dataset` under DYNAMIC sharding (see [`providers`]).
    pub(super) async fn dynamic_providers(
        &self,
        dataset: &str,
    ) -> Result<Vec<ProviderSpec>, CoordError> {
        let def = self.dataset_bytes(dataset, |d| &d.def).await?;
        providers(dataset, &def)
    }

    pub async fn get_split(
        &self,
        id: Option<RequestId>,
        req: pb::GetSplitRequest,
    ) -> Result<pb::GetSplitResponse, CoordError> {
        let end_of_splits = pb::GetSplitResponse {
            split: None,
            end_of_splits: true,
        };
        // A repetition that is over stays over: the applied state may lag the log, never lead
        // it, so this needs neither a write nor a read barrier (workers ask again and again once
        // their input ended).
        let over = self.applied(|s| {
            let p = usize::try_from(req.split_provider_index).ok()?;
            let provider = s
                .iterations
                .get(&req.iteration_id)?
                .providers
                .as_ref()?
                .get(p)?;
            Some(req.repetition < provider.repetition)
        });
        if over == Some(true) {
            return Ok(end_of_splits);
        }
        let op = TfDataOp::GetSplit {
            iteration: req.iteration_id,
            repetition: req.repetition,
            provider: req.split_provider_index,
        };
        let index = match self.commit(id, op).await? {
            TfDataOutput::Split(i) => i,
            other => return Err(unexpected("get_split", &Output::TfData(other))),
        };
        let Some(index) = index else {
            return Ok(end_of_splits);
        };
        let spec = self
            .applied(|s| {
                let p = usize::try_from(req.split_provider_index).ok()?;
                s.iterations
                    .get(&req.iteration_id)?
                    .providers
                    .as_ref()?
                    .get(p)
                    .map(|p| p.spec.clone())
            })
            .ok_or_else(|| {
                CoordError::Internal(format!(
                    "iteration {} handed out split {index} of provider {} and lost it",
                    req.iteration_id, req.split_provider_index
                ))
            })?;
        Ok(pb::GetSplitResponse {
            split: Some(split(&spec, index)?),
            end_of_splits: false,
        })
    }
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

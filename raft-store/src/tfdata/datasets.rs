//! Datasets: GetOrRegisterDataset and DisableCompressionAtRuntime.
//!
//! As in TensorFlow 2.21, datasets are not deduplicated by fingerprint any more: a client that
//! names no id gets a new dataset each time, and one that names an id gets the dataset of that id
//! if it exists, provided its metadata (element spec, compression, cardinality) is the same.

use bytes::Bytes;

use super::{status, Dataset, TfDataOutput, TfDataState, COMPRESSION_SNAPPY};
use crate::error::{Code, OpError};

impl TfDataState {
    pub(super) fn register_dataset(
        &mut self,
        requested_id: Option<&str>,
        def: &Bytes,
        metadata: &Bytes,
        compression: i32,
    ) -> Result<TfDataOutput, OpError> {
        let requested_id = requested_id.filter(|id| !id.is_empty());
        if let Some(id) = requested_id {
            if let Some(existing) = self.datasets.get(id) {
                if existing.metadata != *metadata {
                    return Err(status(
                        Code::InvalidArgument,
                        format!(
                            "Datasets with the same ID should have the same structure: dataset \
                             ID {id} was registered with other metadata (element spec, \
                             compression or cardinality). To fix this error, make sure you're \
                             registering the same dataset with the same ID."
                        ),
                    ));
                }
                return Ok(TfDataOutput::Dataset(id.to_string()));
            }
        }
        let id = match requested_id {
            Some(id) => id.to_string(),
            None => self.next.dataset.to_string(),
        };
        self.datasets.insert(
            id.clone(),
            Dataset {
                def: def.clone(),
                metadata: metadata.clone(),
                compression,
                compression_disabled: None,
            },
        );
        // TF's UpdateNextAvailableDatasetId: skip ids that clients chose.
        while self.datasets.contains_key(&self.next.dataset.to_string()) {
            self.next.dataset += 1;
        }
        Ok(TfDataOutput::Dataset(id))
    }

    pub(super) fn disable_compression(
        &mut self,
        dataset_id: &str,
        disable: bool,
    ) -> Result<TfDataOutput, OpError> {
        let dataset = self.dataset_mut(dataset_id)?;
        if dataset.compression != COMPRESSION_SNAPPY {
            return Ok(TfDataOutput::Compression(None));
        }
        let decided = *dataset.compression_disabled.get_or_insert(disable);
        Ok(TfDataOutput::Compression(Some(decided)))
    }

    fn dataset_mut(&mut self, id: &str) -> Result<&mut Dataset, OpError> {
        self.datasets
            .get_mut(id)
            .ok_or_else(|| dataset_not_found(id))
    }
}

/// TensorFlow's error for an unknown dataset id.
pub fn dataset_not_found(id: &str) -> OpError {
    status(Code::NotFound, format!("Dataset id {id} not found"))
}

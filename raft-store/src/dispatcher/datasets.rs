//! Datasets: GetOrRegisterDataset of both surfaces, and DisableCompressionAtRuntime.
//!
//! As in TensorFlow 2.21, TensorFlow's graphs are not deduplicated by fingerprint: a client that
//! names no id gets a new dataset each time, and one that names an id gets the dataset of that id
//! if it exists, provided its metadata (element spec, compression, cardinality) is the same.
//! coord's definitions are data, so the same definition is the same dataset: they dedupe by
//! fingerprint.

use bytes::Bytes;

use super::errors::{dataset_not_found, status};
use super::ids::Kind;
use super::{Dataset, DatasetSource, DispatcherOutput, DispatcherState, COMPRESSION_SNAPPY};
use crate::error::{Code, OpError};

impl DispatcherState {
    pub(super) fn register_dataset(
        &mut self,
        requested_id: Option<&str>,
        def: &Bytes,
        metadata: &Bytes,
        compression: i32,
    ) -> Result<DispatcherOutput, OpError> {
        let requested_id = requested_id.filter(|id| !id.is_empty());
        if let Some(id) = requested_id {
            if let Some(existing) = self.datasets.get(id) {
                if existing.metadata != *metadata || existing.source.is_definition() {
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
                return Ok(DispatcherOutput::Dataset(id.to_string()));
            }
        }
        let id = match requested_id {
            Some(id) => id.to_string(),
            None => self.new_id(Kind::Dataset).to_string(),
        };
        self.datasets.insert(
            id.clone(),
            Dataset {
                source: DatasetSource::Graph(def.clone()),
                metadata: metadata.clone(),
                compression,
                compression_disabled: None,
            },
        );
        Ok(DispatcherOutput::Dataset(id))
    }

    pub(super) fn register_definition(
        &mut self,
        fingerprint: u64,
        def: &Bytes,
        total_splits: Option<u64>,
    ) -> DispatcherOutput {
        if let Some(id) = self.by_fingerprint.get(&fingerprint) {
            return DispatcherOutput::Definition {
                id: id.clone(),
                created: false,
            };
        }
        let id = self.new_id(Kind::Dataset).to_string();
        self.datasets.insert(
            id.clone(),
            Dataset {
                source: DatasetSource::Definition {
                    fingerprint,
                    def: def.clone(),
                    total_splits,
                },
                metadata: Bytes::new(),
                compression: 0,
                compression_disabled: None,
            },
        );
        self.by_fingerprint.insert(fingerprint, id.clone());
        DispatcherOutput::Definition { id, created: true }
    }

    pub(super) fn disable_compression(
        &mut self,
        dataset_id: &str,
        disable: bool,
    ) -> Result<DispatcherOutput, OpError> {
        let dataset = self
            .datasets
            .get_mut(dataset_id)
            .ok_or_else(|| dataset_not_found(dataset_id))?;
        if dataset.compression != COMPRESSION_SNAPPY {
            return Ok(DispatcherOutput::Compression(None));
        }
        let decided = *dataset.compression_disabled.get_or_insert(disable);
        Ok(DispatcherOutput::Compression(Some(decided)))
    }
}

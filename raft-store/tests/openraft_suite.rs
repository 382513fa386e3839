//! openraft's own storage conformance suite, run against the log store (on each engine) and the
//! state machine.

#[macro_use]
mod common;

use coord_raft_store::storage::{LogStore, RaftLogEngine, StateMachineStore, StoreOptions};
use coord_raft_store::types::{StorageError, TypeConfig};
use openraft::testing::{StoreBuilder, Suite};

struct DataDirBuilder(RaftLogEngine);

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for DataDirBuilder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = StoreOptions {
            log_engine: self.0,
            ..StoreOptions::default()
        };
        let (log, sm) = common::open_store(dir.path(), options);
        Ok((dir, log, sm))
    }
}

fn openraft_storage_suite(engine: RaftLogEngine) {
    if let Err(e) = Suite::test_all(DataDirBuilder(engine)) {
        panic!("openraft storage suite failed on the {engine} engine: {e}");
    }
}

for_each_engine!(openraft_storage_suite);

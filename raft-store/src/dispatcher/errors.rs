//! The dispatcher's refusals, in the words of the surface whose op is refused: TensorFlow's
//! messages for TensorFlow's RPCs (its clients and tests read them), coord's for coord's. A leaf:
//! every update's module builds its refusals here.

use super::model::Dataset;
use crate::error::{Code, OpError};

/// A refusal with `code` and `message`.
pub(crate) fn status(code: Code, message: String) -> OpError {
    OpError::Status { code, message }
}

/// TensorFlow's error for an unknown dataset id.
pub fn dataset_not_found(id: &str) -> OpError {
    status(Code::NotFound, format!("Dataset id {id} not found"))
}

/// The refusal of a dataset whose workers cannot serve the surface that asked: TensorFlow's
/// workers run graphs, coord's data workers run definitions.
pub fn wrong_kind(id: &str, dataset: &Dataset) -> OpError {
    let (is, needs) = if dataset.source.is_definition() {
        (
            "a coord dataset definition (coord.dispatcher)",
            "TensorFlow's workers cannot produce it",
        )
    } else {
        (
            "a TensorFlow dataset graph (tensorflow.data.DispatcherService)",
            "coord's data workers cannot produce it",
        )
    };
    status(
        Code::FailedPrecondition,
        format!("dataset {id} is {is}: {needs}"),
    )
}

/// TensorFlow's error for an unknown job id.
pub fn job_not_found(id: i64) -> OpError {
    status(Code::NotFound, format!("Job with id {id} not found"))
}

/// TensorFlow's error for an unknown iteration id.
pub fn iteration_not_found(id: i64) -> OpError {
    status(Code::NotFound, format!("Iteration id {id} not found"))
}

/// TensorFlow's error for an unknown task id.
pub fn task_not_found(id: i64) -> OpError {
    status(Code::NotFound, format!("Task {id} not found"))
}

/// coord's error for an id the dispatcher does not know.
pub fn not_known(what: &str, id: impl std::fmt::Display) -> OpError {
    status(
        Code::NotFound,
        format!("{what} {id} is not known to the dispatcher"),
    )
}

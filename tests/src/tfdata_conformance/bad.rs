//! TF's client with bad input: an unknown dataset id, a named job asked for differently, round
//! robin on a finite dataset, static sharding without a worker list.

use std::time::Duration;

use super::START_PATIENCE;
use crate::tf_service::{BadInput, CallOutcome, TfDataProcs, TfError};

/// The scenario: calls of TF's client with bad input against `dispatcher` (which has no fixed
/// worker list), with one worker up.
pub async fn bad_input(procs: &TfDataProcs, dispatcher: &str) -> Vec<(BadInput, Vec<CallOutcome>)> {
    let starting = procs.start_worker(dispatcher, None);
    let outcomes = procs.bad_input(dispatcher, &BadInput::ALL, Duration::from_secs(60));
    let (_worker, outcomes) = tokio::join!(starting.ready(START_PATIENCE), outcomes);
    for (case, results) in &outcomes {
        for r in results {
            match r {
                Ok(elements) => eprintln!("  {:<22} read {elements:?}", case.as_str()),
                Err(e) => eprintln!("  {:<22} {}", case.as_str(), e.brief()),
            }
        }
    }
    outcomes
}

pub fn error_of(case: BadInput, r: &CallOutcome) -> &TfError {
    match r {
        Err(e) => e,
        Ok(elements) => panic!("{}: read {elements:?}, expected an error", case.as_str()),
    }
}

/// What TF 2.21 answers to each bad input.
pub fn check_bad_input(outcomes: &[(BadInput, Vec<CallOutcome>)]) {
    for (case, results) in outcomes {
        let case = *case;
        match case {
            BadInput::UnknownDatasetId => {
                let e = error_of(case, &results[0]);
                assert_eq!(e.code, "NOT_FOUND", "{e}");
                assert!(e.message.contains("Dataset id 424242 not found"), "{e}");
            }
            BadInput::JobModeMismatch => {
                assert_eq!(results[0].as_ref().ok(), Some(&(0..10).collect()));
                let e = error_of(case, &results[1]);
                assert_eq!(e.code, "INVALID_ARGUMENT", "{e}");
                assert!(
                    e.message
                        .contains("found an existing job with different parameters"),
                    "{e}"
                );
            }
            // TF does not compare num_consumers with the job's: both consumers read, each its
            // half of the rounds.
            BadInput::ConsumersMismatch => {
                assert_eq!(results[0].as_ref().ok(), Some(&vec![0, 2, 4, 6]));
                assert_eq!(results[1].as_ref().ok(), Some(&vec![1, 3, 5, 7]));
            }
            BadInput::RoundRobinFinite => {
                let e = error_of(case, &results[0]);
                assert_eq!(e.code, "FAILED_PRECONDITION", "{e}");
                assert!(
                    e.message.contains(
                        "Round robin reads require that the input dataset has infinite cardinality"
                    ),
                    "{e}"
                );
            }
            BadInput::StaticUnconfigured => {
                let e = error_of(case, &results[0]);
                assert_eq!(e.code, "NOT_FOUND", "{e}");
                assert!(e.message.contains("is not in the workers list"), "{e}");
            }
        }
    }
}

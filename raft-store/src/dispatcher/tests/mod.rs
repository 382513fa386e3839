//! The dispatcher as pure functions: no sockets, no runtime. TensorFlow's RPCs ([`tf`],
//! [`tf_workers`]), coord's protocol over the same state ([`coord`]), states and logs of before
//! ([`legacy`]), and random updates of both ([`fuzz`]).

mod coord;
mod fuzz;
mod legacy;
mod tf;
mod tf_workers;

use std::collections::BTreeMap;

use bytes::Bytes;

use super::*;
pub(super) use crate::error::{Code, OpError};

pub(super) fn op(s: &mut DispatcherState, op: DispatcherOp) -> DispatcherResult {
    let before = s.clone();
    let out = s.apply(&op);
    if out.is_err() {
        assert_eq!(*s, before, "a refused {op} changed the state");
    }
    out
}

pub(super) fn register(
    s: &mut DispatcherState,
    id: Option<&str>,
    metadata: &str,
) -> DispatcherResult {
    op(
        s,
        DispatcherOp::RegisterDataset {
            requested_id: id.map(str::to_string),
            def: Bytes::from_static(b"graph"),
            metadata: Bytes::from(metadata.to_string()),
            compression: COMPRESSION_SNAPPY,
        },
    )
}

pub(super) fn job(
    s: &mut DispatcherState,
    dataset: &str,
    sharding: i32,
    name: Option<&str>,
) -> DispatcherResult {
    job_with(s, dataset, sharding, name, None)
}

pub(super) fn job_with(
    s: &mut DispatcherState,
    dataset: &str,
    sharding: i32,
    name: Option<&str>,
    num_consumers: Option<i64>,
) -> DispatcherResult {
    op(
        s,
        DispatcherOp::GetOrCreateJob {
            dataset: dataset.into(),
            sharding,
            name: name.map(str::to_string),
            anonymous_tag: 77,
            num_consumers,
            target_workers: 1,
            cross_trainer_cache: false,
        },
    )
}

pub(super) fn splits(n: u64) -> Vec<ProviderSpec> {
    vec![ProviderSpec {
        spec: Bytes::from_static(b"range"),
        splits: n,
    }]
}

pub(super) fn iteration(
    s: &mut DispatcherState,
    job: i64,
    repetition: i64,
    n: u64,
) -> (i64, i64, Vec<i64>) {
    match op(
        s,
        DispatcherOp::GetOrCreateIteration {
            job,
            repetition,
            providers: splits(n),
        },
    ) {
        Ok(DispatcherOutput::Iteration {
            client,
            iteration,
            new_tasks,
        }) => (client, iteration, new_tasks),
        other => panic!("iteration: {other:?}"),
    }
}

pub(super) fn worker(s: &mut DispatcherState, address: &str, rounds: &[(i64, i64)]) {
    let out = op(
        s,
        DispatcherOp::WorkerHeartbeat {
            address: address.into(),
            transfer_servers: vec![Bytes::from_static(b"grpc")],
            tags: vec![],
            uid: -1,
            index: None,
            rounds: rounds.iter().copied().collect::<BTreeMap<_, _>>(),
        },
    );
    assert_eq!(out, Ok(DispatcherOutput::Done));
}

pub(super) fn split(s: &mut DispatcherState, iteration: i64, repetition: i64) -> Option<u64> {
    match op(
        s,
        DispatcherOp::GetSplit {
            iteration,
            repetition,
            provider: 0,
            max: 1,
        },
    ) {
        Ok(DispatcherOutput::Splits { count: 0, .. }) => None,
        Ok(DispatcherOutput::Splits { from, count: 1 }) => Some(from),
        other => panic!("split: {other:?}"),
    }
}

pub(super) fn code(r: DispatcherResult) -> Code {
    match r {
        Err(OpError::Status { code, .. }) => code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

pub(super) fn message(r: DispatcherResult) -> String {
    match r {
        Err(OpError::Status { message, .. }) => message,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

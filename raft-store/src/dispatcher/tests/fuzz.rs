//! Random updates of both surfaces over a small id space (so they hit existing and missing ids
//! alike): apply never panics, a refused update leaves the state exactly as it was, and leases
//! stay consistent.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::*;

fn random_op(next: &mut impl FnMut() -> u64) -> DispatcherOp {
    let id = 1000 + (next() % 8) as i64 * 1000 + (next() % 6) as i64;
    let addr = format!("w{}", next() % 4);
    let mode = (next() % 4) as i32;
    let consumers = [None, Some(0), Some(1 + (next() % 3) as i64)][(next() % 3) as usize];
    let name = next().is_multiple_of(2).then(|| format!("j{}", next() % 3));
    let micros = (next() % 1000) as i64;
    match next() % 17 {
        0 => DispatcherOp::RegisterDefinition {
            fingerprint: next() % 5,
            def: Bytes::from_static(b"d"),
            total_splits: [None, Some(0), Some(next() % 50)][(next() % 3) as usize],
        },
        1 => DispatcherOp::JoinJob {
            dataset: (1000 + next() % 6).to_string(),
            sharding: mode,
            name,
            anonymous_tag: next(),
            num_consumers: consumers,
        },
        2 => DispatcherOp::ReleaseClient {
            client: id,
            time_micros: micros,
        },
        3 => DispatcherOp::ClientTimeout {
            client: id,
            time_micros: micros,
        },
        4 => DispatcherOp::RegisterDataWorker {
            address: addr,
            rounds: BTreeMap::from([(id, (next() % 100) as i64)]),
        },
        5 => DispatcherOp::DataWorkerTimeout {
            address: addr,
            registration: next() % 12,
        },
        6 | 7 => DispatcherOp::LeaseSplits {
            task: id,
            done: (0..next() % 3).map(|_| next() % 50).collect(),
            max: (next() % 10) as u32,
        },
        8 => DispatcherOp::ReportDelivery {
            address: addr,
            done: (0..next() % 3).map(|_| (id, next() % 50)).collect(),
            completed: (0..next() % 2).map(|_| id).collect(),
        },
        9 => DispatcherOp::ClientHeartbeat {
            client: id,
            current_round: Some((next() % 200) as i64 - 50),
            blocked_round: next().is_multiple_of(2).then(|| (next() % 200) as i64),
            client_round: (next() % 200) as i64,
        },
        10 => DispatcherOp::CollectJob { iteration: id },
        11 => DispatcherOp::RegisterDataset {
            requested_id: next()
                .is_multiple_of(3)
                .then(|| (1000 + next() % 6).to_string()),
            def: Bytes::from_static(b"g"),
            metadata: Bytes::from_static(b"m"),
            compression: 0,
        },
        12 => DispatcherOp::GetOrCreateJob {
            dataset: (1000 + next() % 6).to_string(),
            sharding: mode,
            name,
            anonymous_tag: next(),
            num_consumers: consumers,
            target_workers: 0,
            cross_trainer_cache: false,
        },
        13 => DispatcherOp::GetOrCreateIteration {
            job: 5000 + (next() % 5) as i64,
            repetition: (next() % 2) as i64,
            providers: vec![ProviderSpec {
                spec: Bytes::new(),
                splits: next() % 20,
            }],
        },
        14 => DispatcherOp::WorkerHeartbeat {
            address: addr,
            transfer_servers: vec![],
            tags: vec![],
            uid: 0,
            index: None,
            rounds: BTreeMap::new(),
        },
        15 => DispatcherOp::GetSplit {
            iteration: id,
            repetition: (next() % 2) as i64,
            provider: (next() % 2) as i64,
            max: next() % 4,
        },
        _ => DispatcherOp::WorkerLost { address: addr },
    }
}

#[test]
fn fuzz_updates_never_panic_and_refusals_change_nothing() {
    let mut next = coord_proto::fuzz::xorshift(0x2545_F491_4F6C_DD1D);
    let mut s = DispatcherState::default();
    let (mut applied, mut refused) = (0, 0);
    for step in 0..30_000u64 {
        let o = random_op(&mut next);
        let before = s.clone();
        match s.apply(&o) {
            Ok(_) => applied += 1,
            Err(_) => {
                assert_eq!(s, before, "step {step}: refused {o} changed the state");
                refused += 1;
            }
        }
        // Invariants: a leased split was handed out; leases point at tasks of their own
        // iteration; a worker's tasks are its own.
        for it in s.iterations.values() {
            for p in it.providers.iter().flatten() {
                let Some(l) = &p.leases else { continue };
                for (split, task) in &l.leased {
                    assert!(
                        *split < p.index,
                        "step {step}: leased split {split} never handed out"
                    );
                    assert_eq!(
                        s.tasks.get(task).map(|t| t.iteration),
                        Some(it.id),
                        "step {step}"
                    );
                }
            }
        }
        for (address, w) in &s.workers {
            for t in &w.tasks {
                assert_eq!(
                    s.tasks.get(t).map(|t| t.worker.as_str()),
                    Some(address.as_str()),
                    "step {step}"
                );
            }
        }
    }
    assert!(
        applied > 5_000 && refused > 5_000,
        "{applied} applied, {refused} refused"
    );
}

use super::*;
use crate::coord::dispatcher::{BatchOp, FilesSource, FilterOp, RangeSource, RepeatOp};

fn op(kind: dataset_op::Kind) -> DatasetOp {
    DatasetOp { kind: Some(kind) }
}

fn values(plan: &Plan, splits: impl Iterator<Item = u64>, shard: Option<(u64, u64)>) -> Vec<i64> {
    let mut files = FileCache::default();
    splits
        .flat_map(|s| plan.split_elements(s, shard, &mut files).unwrap())
        .map(|e| range_value(&e.data).unwrap())
        .collect()
}

#[test]
fn crc32c_known_value() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn range_splits_cover_the_range_once() {
    let mut def = range(3, 20);
    def.records_per_split = 4;
    let plan = Plan::new(&def).unwrap();
    assert_eq!(plan.total_splits(), Some(5));
    assert_eq!(values(&plan, 0..5, None), (3..20).collect::<Vec<_>>());
}

#[test]
fn filter_repeat_and_data_sharding() {
    let mut def = range(0, 10);
    def.ops = vec![
        op(dataset_op::Kind::Repeat(RepeatOp { count: 2 })),
        op(dataset_op::Kind::Filter(FilterOp {
            modulo: 2,
            remainder: 1,
        })),
    ];
    let plan = Plan::new(&def).unwrap();
    assert_eq!(plan.total_splits(), Some(20));
    let odd: Vec<i64> = (1..10).step_by(2).collect();
    assert_eq!(values(&plan, 0..20, None), [odd.clone(), odd].concat());
    // DATA sharding: the shards partition the records.
    let a = values(&plan, 0..10, Some((0, 2)));
    let b = values(&plan, 0..10, Some((1, 2)));
    assert!(a.is_empty(), "every kept record is odd: {a:?}");
    assert_eq!(b, vec![1, 3, 5, 7, 9]);
}

#[test]
fn file_sharding_partitions_splits() {
    let plan = Plan::new(&range(0, 7)).unwrap();
    let mut seen: Vec<u64> = (0..3)
        .flat_map(|i| plan.static_splits(ProcessingMode::File, (i, 3)).unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, (0..7).collect::<Vec<_>>());
}

#[test]
fn batches_stay_within_a_split() {
    let mut def = range(0, 5);
    def.records_per_split = 5;
    def.ops = vec![op(dataset_op::Kind::Batch(BatchOp { size: 2 }))];
    let plan = Plan::new(&def).unwrap();
    let els = plan
        .split_elements(0, None, &mut FileCache::default())
        .unwrap();
    assert_eq!(els.len(), 3);
    assert_eq!(
        els.iter().map(|e| e.offset).collect::<Vec<_>>(),
        vec![0, 2, 4]
    );
    assert_eq!(els[2].data.len(), 4 + 8);
}

#[test]
fn record_files_are_checked() {
    let dir = tempdir();
    let path = dir.join("a.rec");
    let shard = write_record_file(&path, &[b"x", b"yy", b"zzz"]).unwrap();
    let def = DatasetDef {
        sources: vec![Source {
            kind: Some(source::Kind::Files(FilesSource {
                shards: vec![shard.clone()],
            })),
        }],
        ops: vec![],
        records_per_split: 2,
    };
    let plan = Plan::new(&def).unwrap();
    let mut files = FileCache::default();
    let els = plan.split_elements(1, None, &mut files).unwrap();
    assert_eq!(els[0].data, Bytes::from_static(b"zzz"));
    let mut wrong = def.clone();
    if let Some(source::Kind::Files(f)) = &mut wrong.sources[0].kind {
        f.shards[0].num_records = 4;
    }
    let err = Plan::new(&wrong)
        .unwrap()
        .split_elements(0, None, &mut FileCache::default())
        .unwrap_err();
    assert!(err.contains("holds 3 records"), "{err}");
    std::fs::write(&path, b"garbage").unwrap();
    let err = plan
        .split_elements(0, None, &mut FileCache::default())
        .unwrap_err();
    assert!(err.contains("CRC-32C"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("coord-dataset-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn bad_definitions_name_the_culprit() {
    let cases: Vec<(DatasetDef, &str)> = vec![
        (DatasetDef::default(), "no sources"),
        (
            DatasetDef {
                sources: vec![Source {
                    kind: Some(source::Kind::Range(RangeSource {
                        start: 0,
                        end: 5,
                        step: 0,
                    })),
                }],
                ..Default::default()
            },
            "source 0: range step",
        ),
        (
            DatasetDef {
                ops: vec![op(dataset_op::Kind::Filter(FilterOp {
                    modulo: 2,
                    remainder: 2,
                }))],
                ..range(0, 3)
            },
            "op 0: filter",
        ),
        (
            DatasetDef {
                ops: vec![
                    op(dataset_op::Kind::Batch(BatchOp { size: 2 })),
                    op(dataset_op::Kind::Batch(BatchOp { size: 3 })),
                ],
                ..range(0, 3)
            },
            "op 1: a second batch",
        ),
    ];
    for (def, want) in cases {
        let err = Plan::new(&def).unwrap_err();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    }
}

#[test]
fn fingerprint_ignores_default_spelling() {
    let mut a = range(0, 10);
    a.records_per_split = 0;
    let b = range(0, 10);
    assert_eq!(fingerprint(&a), fingerprint(&b));
    assert_ne!(fingerprint(&b), fingerprint(&range(0, 11)));
}

/// A small deterministic generator (xorshift64*), so the fuzz runs are repeatable.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Mostly small values, sometimes the extremes.
    fn num(&mut self) -> u64 {
        match self.next() % 8 {
            0 => u64::MAX - self.next() % 3,
            1 => 0,
            2 => self.next(),
            _ => self.next() % 20,
        }
    }

    fn int(&mut self) -> i64 {
        match self.next() % 6 {
            0 => i64::MIN + (self.next() % 3) as i64,
            1 => i64::MAX - (self.next() % 3) as i64,
            _ => (self.next() % 41) as i64 - 20,
        }
    }
}

fn random_def(g: &mut Gen) -> DatasetDef {
    let sources = (0..g.next() % 4)
        .map(|_| Source {
            kind: match g.next() % 5 {
                0 => None,
                _ => Some(source::Kind::Range(RangeSource {
                    start: g.int(),
                    end: g.int(),
                    step: g.int(),
                })),
            },
        })
        .collect();
    let ops = (0..g.next() % 4)
        .map(|_| DatasetOp {
            kind: match g.next() % 4 {
                0 => Some(dataset_op::Kind::Filter(FilterOp {
                    modulo: g.num(),
                    remainder: g.num(),
                })),
                1 => Some(dataset_op::Kind::Batch(BatchOp { size: g.num() })),
                2 => Some(dataset_op::Kind::Repeat(RepeatOp { count: g.num() })),
                _ => None,
            },
        })
        .collect();
    DatasetDef {
        sources,
        ops,
        records_per_split: g.num(),
    }
}

/// Random definitions (extreme numbers included) and random bytes: validation never panics,
/// and a valid plan produces any split it counts without panicking.
#[test]
fn fuzz_definitions_never_panic() {
    use prost::Message;
    let mut g = Gen(0x9E37_79B9_7F4A_7C15);
    let mut valid = 0;
    for _ in 0..20_000 {
        let def = random_def(&mut g);
        let _ = fingerprint(&def);
        let Ok(plan) = Plan::new(&def) else {
            continue;
        };
        valid += 1;
        let per_epoch = plan.splits_per_epoch();
        let mut files = FileCache::default();
        for s in [0, 1, per_epoch.saturating_sub(1), per_epoch, g.next()] {
            let within = plan.total_splits().is_none_or(|t| s < t) && per_epoch > 0;
            // Produce only small splits (a split of a huge range may hold 2^48 records).
            let small = plan.locate(s).is_some_and(|(_, b, e)| e - b <= 64);
            if within && small {
                plan.split_elements(s, None, &mut files)
                    .expect("a counted split");
                plan.split_elements(s, Some((1, 3)), &mut files)
                    .expect("a counted split");
            } else if !within {
                assert!(plan.split_elements(s, None, &mut files).is_err());
            }
        }
        for mode in [
            ProcessingMode::Off,
            ProcessingMode::File,
            ProcessingMode::Data,
        ] {
            let n = 1 + g.next() % 4;
            let _: Vec<u64> = plan
                .static_splits(mode, (g.next() % n, n))
                .unwrap()
                .take(5)
                .collect();
        }
    }
    assert!(
        valid > 1_000,
        "only {valid} valid definitions: the generator is too harsh"
    );
    for _ in 0..20_000 {
        let bytes: Vec<u8> = (0..g.next() % 64).map(|_| g.next() as u8).collect();
        if let Ok(def) = DatasetDef::decode(bytes.as_slice()) {
            let _ = Plan::new(&def);
        }
    }
}

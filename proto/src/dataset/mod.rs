//! Dataset definitions ([`DatasetDef`]): what a dataset is, as data.
//!
//! There are no TF graphs here. A dataset is a list of sources (integer ranges and record files)
//! read in order, cut into *splits* of `records_per_split` records that never cross a source or
//! file boundary, then filtered, batched and repeated. Everything is a pure function of the
//! definition: split `s` is always the same records, so the dispatcher's replicated state for a
//! split provider is one counter, and a split handed out again after its worker died produces the
//! same elements with the same identities.
//!
//! Both sides use this module: the dispatcher validates a definition and counts its splits; the
//! data worker produces elements.

mod records;

pub use records::{crc32c, write_record_file, FileCache};

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use crate::coord::dispatcher::{dataset_op, source, DatasetDef, DatasetOp, ProcessingMode, Source};

/// Sources and records past this are refused: the split arithmetic stays far from overflow.
const MAX_RECORDS: u64 = 1 << 48;

/// The definition's shape, checked: one unit per range source or file shard.
#[derive(Clone, Debug)]
pub struct Plan {
    units: Vec<Unit>,
    /// Splits per epoch, and the first split of each unit.
    base_splits: u64,
    records_per_split: u64,
    filter: Option<(u64, u64)>,
    batch: u64,
    /// Epochs; `None` = forever.
    epochs: Option<u64>,
}

#[derive(Clone, Debug)]
struct Unit {
    kind: UnitKind,
    records: u64,
    /// Index of this unit's first record in the whole sequence (what Filter looks at).
    first_record: u64,
    first_split: u64,
}

#[derive(Clone, Debug)]
enum UnitKind {
    Range { start: i64, step: i64 },
    File { path: String, crc32c: u32 },
}

/// One element: its bytes and its identity within the job (split, index in the split of its first
/// record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Element {
    pub split: u64,
    pub offset: u64,
    pub data: Bytes,
}

/// The 64-bit fingerprint of a definition: FNV-1a over its canonical encoding (prost writes fields
/// in field order; the defaults are made explicit first), so equal definitions dedupe.
pub fn fingerprint(def: &DatasetDef) -> u64 {
    let mut canonical = def.clone();
    canonical.records_per_split = canonical.records_per_split.max(1);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in canonical.encode_to_vec() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn range_len(start: i64, end: i64, step: i64) -> u64 {
    if end <= start {
        return 0;
    }
    let span = (i128::from(end) - i128::from(start)) as u128;
    let step = step as u128;
    span.div_ceil(step) as u64
}

impl Plan {
    /// Checks `def`; the error names the offending source, shard or op.
    pub fn new(def: &DatasetDef) -> Result<Plan, String> {
        if def.sources.is_empty() {
            return Err("dataset definition has no sources".into());
        }
        let mut units = Vec::new();
        let mut first_record = 0u64;
        for (i, s) in def.sources.iter().enumerate() {
            match &s.kind {
                None => return Err(format!("source {i} has no kind (range or files)")),
                Some(source::Kind::Range(r)) => {
                    if r.step <= 0 {
                        return Err(format!(
                            "source {i}: range step must be positive, got {}",
                            r.step
                        ));
                    }
                    let records = range_len(r.start, r.end, r.step);
                    units.push(Unit {
                        kind: UnitKind::Range {
                            start: r.start,
                            step: r.step,
                        },
                        records,
                        first_record,
                        first_split: 0,
                    });
                    first_record = first_record.saturating_add(records);
                }
                Some(source::Kind::Files(f)) => {
                    if f.shards.is_empty() {
                        return Err(format!("source {i}: files source has no shards"));
                    }
                    for (j, shard) in f.shards.iter().enumerate() {
                        if shard.path.is_empty() {
                            return Err(format!("source {i} shard {j}: empty path"));
                        }
                        units.push(Unit {
                            kind: UnitKind::File {
                                path: shard.path.clone(),
                                crc32c: shard.crc32c,
                            },
                            records: shard.num_records,
                            first_record,
                            first_split: 0,
                        });
                        first_record = first_record.saturating_add(shard.num_records);
                    }
                }
            }
            if first_record > MAX_RECORDS {
                return Err(format!(
                    "source {i}: the dataset has more than {MAX_RECORDS} records"
                ));
            }
        }
        let records_per_split = def.records_per_split.max(1);
        let mut base_splits = 0u64;
        for u in &mut units {
            u.first_split = base_splits;
            base_splits += u.records.div_ceil(records_per_split);
        }
        let (mut filter, mut batch, mut epochs) = (None, None, None);
        for (i, op) in def.ops.iter().enumerate() {
            let dup = || {
                format!(
                    "op {i}: a second {} op (each op may appear once)",
                    op_name(op)
                )
            };
            match &op.kind {
                None => return Err(format!("op {i} has no kind (filter, batch or repeat)")),
                Some(dataset_op::Kind::Filter(f)) => {
                    if f.modulo == 0 || f.remainder >= f.modulo {
                        return Err(format!(
                            "op {i}: filter needs 0 <= remainder < modulo, got remainder {} modulo {}",
                            f.remainder, f.modulo
                        ));
                    }
                    if filter.replace((f.modulo, f.remainder)).is_some() {
                        return Err(dup());
                    }
                }
                Some(dataset_op::Kind::Batch(b)) => {
                    if b.size == 0 {
                        return Err(format!("op {i}: batch size must be positive"));
                    }
                    if batch.replace(b.size).is_some() {
                        return Err(dup());
                    }
                }
                Some(dataset_op::Kind::Repeat(r)) => {
                    if epochs.replace(r.count).is_some() {
                        return Err(dup());
                    }
                }
            }
        }
        Ok(Plan {
            units,
            base_splits,
            records_per_split,
            filter,
            batch: batch.unwrap_or(1),
            epochs: match epochs {
                None => Some(1),
                Some(0) => None,
                Some(n) => Some(n),
            },
        })
    }

    /// Splits in one pass over the sources.
    pub fn splits_per_epoch(&self) -> u64 {
        self.base_splits
    }

    /// Every split of every epoch; `None` when the dataset repeats forever.
    pub fn total_splits(&self) -> Option<u64> {
        self.epochs.map(|e| e.saturating_mul(self.base_splits))
    }

    /// The unit holding base split `b`, and the record range of the split within it.
    fn locate(&self, split: u64) -> Option<(&Unit, u64, u64)> {
        if self.base_splits == 0 {
            return None;
        }
        if let Some(total) = self.total_splits() {
            if split >= total {
                return None;
            }
        }
        let b = split % self.base_splits;
        let at = self.units.partition_point(|u| u.first_split <= b) - 1;
        let unit = &self.units[at];
        let begin = (b - unit.first_split) * self.records_per_split;
        let end = (begin + self.records_per_split).min(unit.records);
        Some((unit, begin, end))
    }

    /// The elements of split `split`, keeping only records whose index in the whole sequence is
    /// `shard.0` modulo `shard.1` (DATA sharding). Files are read through `files`.
    pub fn split_elements(
        &self,
        split: u64,
        shard: Option<(u64, u64)>,
        files: &mut FileCache,
    ) -> Result<Vec<Element>, String> {
        let Some((unit, begin, end)) = self.locate(split) else {
            return Err(format!("split {split} is past the end of the dataset"));
        };
        let mut out = Vec::new();
        let mut pending: Vec<(u64, Bytes)> = Vec::new();
        for r in begin..end {
            let global = unit.first_record + r;
            if self.filter.is_some_and(|(m, rem)| global % m != rem) {
                continue;
            }
            if shard.is_some_and(|(i, n)| global % n != i) {
                continue;
            }
            let record = match &unit.kind {
                UnitKind::Range { start, step } => {
                    let v = i128::from(*start) + i128::from(r) * i128::from(*step);
                    Bytes::copy_from_slice(&(v as i64).to_le_bytes())
                }
                UnitKind::File { path, crc32c } => files.record(path, *crc32c, unit.records, r)?,
            };
            pending.push((r - begin, record));
            if pending.len() as u64 == self.batch {
                out.push(self.element(split, &mut pending));
            }
        }
        if !pending.is_empty() {
            out.push(self.element(split, &mut pending));
        }
        Ok(out)
    }

    fn element(&self, split: u64, pending: &mut Vec<(u64, Bytes)>) -> Element {
        let offset = pending[0].0;
        let data = if self.batch == 1 {
            pending[0].1.clone()
        } else {
            let mut b = BytesMut::new();
            for (_, r) in pending.iter() {
                b.put_u32_le(r.len() as u32);
                b.put_slice(r);
            }
            b.freeze()
        };
        pending.clear();
        Element {
            split,
            offset,
            data,
        }
    }

    /// The splits a task reads, in order, under static sharding or none: `None` for DYNAMIC
    /// (the dispatcher hands splits out). `shard` is (index, count).
    pub fn static_splits(
        &self,
        mode: ProcessingMode,
        shard: (u64, u64),
    ) -> Option<Box<dyn Iterator<Item = u64> + Send>> {
        let end = self.total_splits().unwrap_or(u64::MAX);
        match mode {
            ProcessingMode::Dynamic => None,
            ProcessingMode::Off | ProcessingMode::Data => Some(Box::new(0..end)),
            ProcessingMode::File => {
                let (i, n) = (shard.0, shard.1.max(1));
                Some(Box::new((i..end).step_by(n as usize)))
            }
        }
    }
}

fn op_name(op: &DatasetOp) -> &'static str {
    match op.kind {
        Some(dataset_op::Kind::Filter(_)) => "filter",
        Some(dataset_op::Kind::Batch(_)) => "batch",
        Some(dataset_op::Kind::Repeat(_)) => "repeat",
        None => "empty",
    }
}

/// A range dataset `[start, end)` with one record per split: TF's `Dataset.range`.
pub fn range(start: i64, end: i64) -> DatasetDef {
    DatasetDef {
        sources: vec![Source {
            kind: Some(source::Kind::Range(crate::coord::dispatcher::RangeSource {
                start,
                end,
                step: 1,
            })),
        }],
        ops: Vec::new(),
        records_per_split: 1,
    }
}

/// Decodes a range element (an i64, little-endian).
pub fn range_value(data: &[u8]) -> Option<i64> {
    Some(i64::from_le_bytes(data.try_into().ok()?))
}

#[cfg(test)]
mod tests;

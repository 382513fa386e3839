//! Applying a [`RawOp`]: deterministic, and reporting every key it touched so that the leader can
//! look again at the calls parked on them.

use bytes::{Bytes, BytesMut};

use super::{shown, stoll, value_bytes, NotInteger, RawKeys, RawOp, RawOutput};
use crate::error::OpError;

type RawResult = Result<RawOutput, OpError>;

impl RawKeys {
    /// Applies `op`; `touched` gets each key whose value or queue it changed.
    pub(crate) fn apply(&mut self, op: &RawOp, touched: &mut Vec<Bytes>) -> RawResult {
        match op {
            RawOp::Set { entries } => {
                for (k, v) in entries {
                    self.put(k.clone(), v.clone());
                    touched.push(k.clone());
                }
                Ok(RawOutput::Done)
            }
            RawOp::CompareSet {
                key,
                expected,
                desired,
            } => Ok(RawOutput::Value(
                self.compare_set(key, expected, desired, touched),
            )),
            RawOp::Add { key, delta } => {
                let total = self.sum(key, *delta)?;
                self.put(key.clone(), Bytes::from(total.to_string()));
                touched.push(key.clone());
                Ok(RawOutput::Count(total))
            }
            RawOp::Append { key, value } => {
                let joined = match self.values.get(key) {
                    Some(old) => {
                        let mut b = BytesMut::with_capacity(old.len() + value.len());
                        b.extend_from_slice(old);
                        b.extend_from_slice(value);
                        b.freeze()
                    }
                    None => value.clone(),
                };
                self.put(key.clone(), joined);
                touched.push(key.clone());
                Ok(RawOutput::Done)
            }
            RawOp::Delete { key } => match self.values.remove(key) {
                Some(v) => {
                    self.bytes -= value_bytes(key, &v);
                    touched.push(key.clone());
                    Ok(RawOutput::Count(1))
                }
                None => Ok(RawOutput::Count(0)),
            },
            RawOp::QueuePush { key, value } => {
                self.bytes += value_bytes(key, value);
                self.queues
                    .entry(key.clone())
                    .or_default()
                    .push_back(value.clone());
                touched.push(key.clone());
                Ok(RawOutput::Done)
            }
            RawOp::QueuePop { key, block } => {
                let Some(queue) = self.queues.get_mut(key) else {
                    return match block {
                        true => Err(OpError::QueueEmpty { key: shown(key) }),
                        false => Ok(RawOutput::Popped {
                            value: None,
                            length: 0,
                        }),
                    };
                };
                let length = queue.len() as u64;
                let value = queue.pop_front();
                if queue.is_empty() {
                    self.queues.remove(key);
                }
                if let Some(v) = &value {
                    self.bytes -= value_bytes(key, v);
                    touched.push(key.clone());
                }
                Ok(RawOutput::Popped { value, length })
            }
        }
    }

    /// How many bytes `op` would add to [`RawKeys::bytes`] at most (0 if it cannot grow the
    /// space), for the quota.
    pub(crate) fn growth_of(&self, op: &RawOp) -> u64 {
        let put = |k: &Bytes, v: usize| match self.values.get(k) {
            Some(old) => (v as u64).saturating_sub(old.len() as u64),
            None => value_bytes(k, &[]) + v as u64,
        };
        match op {
            RawOp::Set { entries } => entries.iter().map(|(k, v)| put(k, v.len())).sum(),
            RawOp::CompareSet { key, desired, .. } => put(key, desired.len()),
            // Room for any 64-bit number.
            RawOp::Add { key, .. } => put(key, 20),
            RawOp::Append { key, value } => put(
                key,
                self.values.get(key).map_or(0, Bytes::len) + value.len(),
            ),
            RawOp::QueuePush { key, value } => value_bytes(key, value),
            RawOp::Delete { .. } | RawOp::QueuePop { .. } => 0,
        }
    }

    /// How many keys `op` would create (a namespace's key limit counts them before the write).
    pub(crate) fn new_keys_of(&self, op: &RawOp) -> u64 {
        let new = |k: &Bytes| u64::from(!self.values.contains_key(k));
        match op {
            RawOp::Set { entries } => {
                let keys: std::collections::BTreeSet<&Bytes> = entries
                    .iter()
                    .map(|(k, _)| k)
                    .filter(|k| new(k) == 1)
                    .collect();
                keys.len() as u64
            }
            RawOp::CompareSet { key, .. } | RawOp::Add { key, .. } | RawOp::Append { key, .. } => {
                new(key)
            }
            RawOp::QueuePush { key, .. } => u64::from(!self.queues.contains_key(key)),
            RawOp::Delete { .. } | RawOp::QueuePop { .. } => 0,
        }
    }

    /// Keys holding a value or a queue.
    pub fn key_count(&self) -> u64 {
        (self.values.len() + self.queues.len()) as u64
    }

    fn put(&mut self, key: Bytes, value: Bytes) {
        let added = value_bytes(&key, &value);
        if let Some(old) = self.values.insert(key.clone(), value) {
            self.bytes -= value_bytes(&key, &old);
        }
        self.bytes += added;
    }

    fn compare_set(
        &mut self,
        key: &Bytes,
        expected: &Bytes,
        desired: &Bytes,
        touched: &mut Vec<Bytes>,
    ) -> Option<Bytes> {
        let swap = match self.values.get(key) {
            None => expected.is_empty(),
            Some(current) => current == expected,
        };
        if swap {
            self.put(key.clone(), desired.clone());
            touched.push(key.clone());
        }
        self.values.get(key).cloned()
    }

    fn sum(&self, key: &Bytes, delta: i64) -> Result<i64, OpError> {
        let current = match self.values.get(key) {
            None => 0,
            Some(v) => stoll(v).map_err(|e| match e {
                NotInteger::NoDigits => OpError::NotAnInteger { key: shown(key) },
                NotInteger::OutOfRange => OpError::Overflow {
                    key: shown(key),
                    delta,
                },
            })?,
        };
        current.checked_add(delta).ok_or_else(|| OpError::Overflow {
            key: shown(key),
            delta,
        })
    }
}

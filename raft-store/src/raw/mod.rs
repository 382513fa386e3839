//! Raw keys: a second key space of the replicated key-value store whose keys are taken exactly as
//! their bytes, with the operations torch's `TCPStore` needs.
//!
//! TensorFlow's keys are paths and are normalized (`/a//b/` is `a/b`, see `crate::key`); torch's
//! are arbitrary byte strings (every one starts with `/`, and `//a` and `/a` are two keys). So raw
//! keys live in maps of their own, never normalized, never seen by TensorFlow's or JAX's calls,
//! by watches or by a job's runs (which delete the path keys a run wrote), and never colliding
//! with a path key whatever their bytes.
//!
//! Besides plain values the space holds queues (a key names a FIFO of values, apart from the
//! key's value, as in torch's server). The mutations ([`RawOp`]) are applied here,
//! deterministically; what waits (a multi-key wait, a counted barrier, a blocking pop) is the
//! leader's business, which parks the call and looks again when a [`RawOp`] touches one of its
//! keys (apply reports each key it changed).
//!
//! Semantics follow torch's libuv server (`TCPStoreLibUvBackend.cpp`, torch 2.15):
//!
//! - compare-and-set: a missing key matches an empty `expected` (and is then set to `desired`);
//!   the answer is the value after the op, or `None` when the key is missing and `expected` was
//!   not empty. (torch's server then answers `expected` itself, its documented quirk; the torch
//!   adapter in coord-proxy does that translation, so other callers can tell "missing" apart.)
//! - add: the value is read as C's `stoll` reads it (leading blanks, a sign, then digits; what
//!   follows is ignored) and the sum is stored as decimal ASCII; a value with no digits is
//!   refused `NotAnInteger`, a sum past 64 bits `Overflow` (torch's server would fail or wrap).
//! - delete removes the key's value only (not its queue) and answers how many keys went (0 or 1).
//! - a blocking pop of an empty queue is refused `QueueEmpty` and that refusal is not remembered
//!   against the request id, so the leader may park the call and apply the same request again.

mod apply;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// Bytes counted against the quota for each value or queued item beyond its own bytes.
pub const RAW_ENTRY_OVERHEAD: u64 = 64;

/// A mutation of the raw key space: one per torch request that changes the store.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum RawOp {
    /// Sets every pair, in order (torch's SET is one pair, MULTI_SET many).
    Set {
        entries: Vec<(Bytes, Bytes)>,
    },
    CompareSet {
        key: Bytes,
        expected: Bytes,
        desired: Bytes,
    },
    /// Adds `delta` to the integer at `key` (missing: 0).
    Add {
        key: Bytes,
        delta: i64,
    },
    /// Appends to the value at `key` (missing: creates it).
    Append {
        key: Bytes,
        value: Bytes,
    },
    /// Removes the value at `key`.
    Delete {
        key: Bytes,
    },
    QueuePush {
        key: Bytes,
        value: Bytes,
    },
    /// Takes the oldest value of the queue at `key`; with `block`, an empty queue is refused
    /// (`QueueEmpty`, not remembered) instead of answered.
    QueuePop {
        key: Bytes,
        block: bool,
    },
}

impl fmt::Display for RawOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawOp::Set { entries } => match entries.as_slice() {
                [(k, v)] => write!(f, "set({:?}, {} bytes)", shown(k), v.len()),
                many => write!(f, "multi_set({} keys)", many.len()),
            },
            RawOp::CompareSet { key, .. } => write!(f, "compare_set({:?})", shown(key)),
            RawOp::Add { key, delta } => write!(f, "add({:?}, {delta})", shown(key)),
            RawOp::Append { key, value } => {
                write!(f, "append({:?}, {} bytes)", shown(key), value.len())
            }
            RawOp::Delete { key } => write!(f, "delete({:?})", shown(key)),
            RawOp::QueuePush { key, value } => {
                write!(f, "queue_push({:?}, {} bytes)", shown(key), value.len())
            }
            RawOp::QueuePop { key, block } => {
                write!(f, "queue_pop({:?}, block={block})", shown(key))
            }
        }
    }
}

/// What a [`RawOp`] answered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum RawOutput {
    Done,
    /// compare-and-set: the value after the op (`None`: the key is missing).
    Value(Option<Bytes>),
    /// add: the new total; delete: how many keys went.
    Count(i64),
    /// pop: the value taken (`None`: the queue was empty) and the queue's length before (torch
    /// answers it).
    Popped {
        value: Option<Bytes>,
        length: u64,
    },
}

/// A raw key for messages: its bytes as text (bytes that are not UTF-8 replaced), at most 64
/// bytes of it. Messages quote it with `{:?}`, which escapes what is not printable.
pub fn shown(key: &[u8]) -> String {
    let text = String::from_utf8_lossy(&key[..key.len().min(64)]).into_owned();
    if key.len() > 64 {
        format!("{text}...")
    } else {
        text
    }
}

/// The raw key space: values and queues by key.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(from = "RawKeysWire")]
pub struct RawKeys {
    values: BTreeMap<Bytes, Bytes>,
    /// Never holds an empty queue: a queue emptied is removed.
    queues: BTreeMap<Bytes, VecDeque<Bytes>>,
    /// What the space counts against the quota; derived, so not stored.
    #[serde(skip)]
    bytes: u64,
}

/// The space as snapshots hold it.
#[derive(Deserialize)]
struct RawKeysWire {
    values: BTreeMap<Bytes, Bytes>,
    queues: BTreeMap<Bytes, VecDeque<Bytes>>,
}

impl From<RawKeysWire> for RawKeys {
    fn from(w: RawKeysWire) -> Self {
        let values: u64 = w.values.iter().map(|(k, v)| value_bytes(k, v)).sum();
        let queued: u64 = w
            .queues
            .iter()
            .flat_map(|(k, q)| q.iter().map(move |v| value_bytes(k, v)))
            .sum();
        RawKeys {
            values: w.values,
            queues: w.queues,
            bytes: values + queued,
        }
    }
}

/// What one value (or queued item) counts against the quota.
fn value_bytes(key: &[u8], value: &[u8]) -> u64 {
    (key.len() + value.len()) as u64 + RAW_ENTRY_OVERHEAD
}

impl RawKeys {
    /// The value at `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Bytes> {
        self.values.get(key)
    }

    /// Whether a wait on `key` is over: the key has a value, or its queue is not empty (torch's
    /// `checkKeys`).
    pub fn ready(&self, key: &[u8]) -> bool {
        self.values.contains_key(key) || self.queues.contains_key(key)
    }

    /// How many values are queued at `key`.
    pub fn queue_len(&self, key: &[u8]) -> usize {
        self.queues.get(key).map_or(0, VecDeque::len)
    }

    /// The keys with a value (queues are not keys, as in torch), in byte order, that start with
    /// `prefix`.
    pub fn keys_with_prefix<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = &'a Bytes> {
        self.values
            .range::<[u8], _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .map(|(k, _)| k)
            .take_while(move |k| k.starts_with(prefix))
    }

    /// The integer at `key` as add reads it (`None`: missing or not a number).
    pub fn counter(&self, key: &[u8]) -> Option<i64> {
        self.values.get(key).and_then(|v| stoll(v).ok())
    }

    /// Keys with a value.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty() && self.queues.is_empty()
    }

    /// What the space counts against the quota.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Why a value is not an integer to [`stoll`].
#[derive(Debug, PartialEq, Eq)]
pub enum NotInteger {
    NoDigits,
    OutOfRange,
}

/// Reads an integer as C's `stoll` does (torch's server adds with it): leading white space, an
/// optional sign, then decimal digits; anything after them is ignored.
pub fn stoll(value: &[u8]) -> Result<i64, NotInteger> {
    let mut rest = value;
    while let [b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c', tail @ ..] = rest {
        rest = tail;
    }
    let negative = matches!(rest.first(), Some(b'-'));
    if matches!(rest.first(), Some(b'-' | b'+')) {
        rest = &rest[1..];
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return Err(NotInteger::NoDigits);
    }
    let mut n: i64 = 0;
    for d in &rest[..digits] {
        let d = i64::from(d - b'0');
        n = n
            .checked_mul(10)
            .and_then(|n| {
                if negative {
                    n.checked_sub(d)
                } else {
                    n.checked_add(d)
                }
            })
            .ok_or(NotInteger::OutOfRange)?;
    }
    Ok(n)
}

//! The one binary encoding used for log entries, snapshots and Raft messages: bincode with varint
//! integers. Decoding is bounded so that a corrupt length prefix cannot ask for an absurd
//! allocation.

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// No single decoded value (a log entry, a Raft message, a whole snapshot) may exceed this: twice
/// the largest memory quota (`--quota-bytes` at most 4 GiB), so a full state's snapshot decodes.
pub const MAX_DECODED_BYTES: u64 = 1 << 33;

#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct CodecError {
    what: &'static str,
    #[source]
    source: bincode::Error,
}

fn options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(MAX_DECODED_BYTES)
}

pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    options()
        .serialize(value)
        .map_err(|source| CodecError { what, source })
}

/// The size of `value` encoded (what it takes in a snapshot or an entry).
pub fn encoded_len<T: Serialize>(value: &T) -> u64 {
    // Unbounded: a size is only counted, never allocated.
    bincode::DefaultOptions::new()
        .serialized_size(value)
        .unwrap_or(u64::MAX)
}

pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    options()
        .deserialize(bytes)
        .map_err(|source| CodecError { what, source })
}

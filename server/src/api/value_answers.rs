//! Key-value answers that many callers read alike, encoded once and sent from one buffer.
//!
//! A large job reads some values from every task: a JAX job's global topology (every device of
//! the job, which every process waits for with a blocking get), a directory every task fills with
//! its own entry and then lists. N tasks reading a value of N entries are N² bytes; tonic would
//! encode each answer into a buffer of its own and hold it until the client has read it. A handler
//! instead asks [`ValueAnswers::shared`] for the answer's one encoding (and, for a caller that
//! accepts it, one gzip of it), attached as a [`SharedAnswer`] (see [`super::shared_answer`]).
//!
//! An answer is known by its method and the (key, value) pairs it carries. A value from the
//! leader's state is the same buffer for every reader, so the common match is a pointer compare;
//! answers a follower relays from the leader are decoded afresh, and match by their bytes. Every
//! kept answer holds its values, so a pointer it compares with is never reused for another value.
//! An answer past the transport's limit (`PEER_MESSAGE_LIMIT`) is left to tonic, which refuses
//! it as it refuses any other.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;

use super::shared_answer::{AnswerBytes, SharedAnswer};
use crate::raft::peers::PEER_MESSAGE_LIMIT;

/// Answers whose values are smaller than this are encoded per caller, as any other: sharing
/// them saves little.
pub const SHARED_FROM: usize = 16 * 1024;

/// Answers kept: the few large values a job reads at about the same time.
const KEPT: usize = 4;

#[derive(Default)]
pub struct ValueAnswers {
    kept: Mutex<VecDeque<Kept>>,
}

struct Kept {
    method: &'static str,
    pairs: Vec<(String, Bytes)>,
    answer: Arc<AnswerBytes>,
}

/// Whether two values are the same: one buffer, or equal bytes.
fn same(a: &Bytes, b: &Bytes) -> bool {
    a.len() == b.len() && (a.as_ptr() == b.as_ptr() || a == b)
}

/// An answer that carries key-value pairs, and only them (with a directory's own key as a pair
/// with no value).
pub trait CarriesValues: prost::Message {
    fn pairs(&self) -> Vec<(&str, &Bytes)>;
}

/// A directory's own key in its answer's pairs.
static NO_VALUE: Bytes = Bytes::new();

/// Implements [`CarriesValues`] for a surface's answers: `single` ones carry one entry in `kv`;
/// `dir` ones their `directory_key` and every entry in `kv`.
macro_rules! carries_values {
    (single: $($one:ty),*; dir: $($dir:ty),*) => {
        $(impl $crate::api::value_answers::CarriesValues for $one {
            fn pairs(&self) -> Vec<(&str, &bytes::Bytes)> {
                self.kv.iter().map(|e| (e.key.as_str(), &e.value)).collect()
            }
        })*
        $(impl $crate::api::value_answers::CarriesValues for $dir {
            fn pairs(&self) -> Vec<(&str, &bytes::Bytes)> {
                std::iter::once((self.directory_key.as_str(), $crate::api::value_answers::no_value()))
                    .chain(self.kv.iter().map(|e| (e.key.as_str(), &e.value)))
                    .collect()
            }
        })*
    };
}
pub(crate) use carries_values;

/// The value of a directory's own key in its answer's pairs.
pub fn no_value() -> &'static Bytes {
    &NO_VALUE
}

impl ValueAnswers {
    /// `answer` with its shared encoding attached, when it carries enough bytes of values.
    pub fn attach<M: CarriesValues>(
        &self,
        method: &'static str,
        mut answer: tonic::Response<M>,
    ) -> tonic::Response<M> {
        if let Some(shared) = self.shared(method, &answer.get_ref().pairs(), answer.get_ref()) {
            answer.extensions_mut().insert(shared);
        }
        answer
    }

    /// The shared encoding of `answer`, a `method` answer that carries exactly `pairs`; none when
    /// its values are too small to gain from it.
    fn shared(
        &self,
        method: &'static str,
        pairs: &[(&str, &Bytes)],
        answer: &impl prost::Message,
    ) -> Option<SharedAnswer> {
        let bytes: usize = pairs.iter().map(|(_, v)| v.len()).sum();
        // Past the transport's limit the answer goes the ordinary way, and tonic refuses it.
        if bytes < SHARED_FROM || answer.encoded_len() > PEER_MESSAGE_LIMIT {
            return None;
        }
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let found = kept.iter().find(|k| {
            k.method == method
                && k.pairs.len() == pairs.len()
                && k.pairs
                    .iter()
                    .zip(pairs)
                    .all(|((key, value), (k2, v2))| key == k2 && same(value, v2))
        });
        if let Some(k) = found {
            return Some(SharedAnswer(k.answer.clone()));
        }
        let encoded = Arc::new(AnswerBytes::encode(answer));
        if kept.len() >= KEPT {
            kept.pop_front();
        }
        kept.push_back(Kept {
            method,
            pairs: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), (*v).clone()))
                .collect(),
            answer: encoded.clone(),
        });
        Some(SharedAnswer(encoded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn answer(key: &str, value: &Bytes) -> coord_proto::tensorflow::GetKeyValueResponse {
        coord_proto::tensorflow::GetKeyValueResponse {
            kv: Some(coord_proto::tensorflow::KeyValueEntry {
                key: key.into(),
                value: value.clone(),
            }),
        }
    }

    fn get(cache: &ValueAnswers, key: &str, value: &Bytes) -> Option<Arc<AnswerBytes>> {
        cache
            .shared("GetKeyValue", &[(key, value)], &answer(key, value))
            .map(|s| s.0)
    }

    #[test]
    fn one_encoding_serves_every_reader_of_a_value() {
        let cache = ValueAnswers::default();
        let topology = Bytes::from(vec![7u8; SHARED_FROM]);
        let first = get(&cache, "jax/topology", &topology).expect("shared");
        let again = get(&cache, "jax/topology", &topology.clone()).expect("shared");
        assert!(Arc::ptr_eq(&first, &again), "the same buffer");
        // A relayed answer is another buffer with the same bytes.
        let relayed = Bytes::from(topology.to_vec());
        let third = get(&cache, "jax/topology", &relayed).expect("shared");
        assert!(Arc::ptr_eq(&first, &third));
        assert_eq!(
            first.message(),
            &answer("jax/topology", &topology).encode_to_vec()[..]
        );
    }

    #[test]
    fn another_value_or_key_is_another_answer_and_small_ones_are_not_shared() {
        let cache = ValueAnswers::default();
        let a = Bytes::from(vec![1u8; SHARED_FROM]);
        let mut changed = a.to_vec();
        changed[SHARED_FROM - 1] = 2;
        let b = Bytes::from(changed);
        let first = get(&cache, "k", &a).expect("shared");
        assert!(!Arc::ptr_eq(&first, &get(&cache, "k", &b).expect("shared")));
        assert!(!Arc::ptr_eq(
            &first,
            &get(&cache, "other", &a).expect("shared")
        ));
        assert!(get(&cache, "k", &Bytes::from(vec![1u8; SHARED_FROM - 1])).is_none());
        // Kept answers are bounded: the oldest goes first.
        for i in 0..KEPT {
            get(&cache, &format!("fill{i}"), &a);
        }
        assert!(!Arc::ptr_eq(&first, &get(&cache, "k", &a).expect("shared")));
    }
}

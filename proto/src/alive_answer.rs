//! XLA's `GetAliveTasksResponse`, able to carry its fields encoded once.
//!
//! Every task asking about a set in a round gets the same answer: the live tasks and their
//! incarnations, N of each for a job of N tasks that asks about itself. A sidecar fetches a
//! round's answer once for all its tasks; decoded, it would copy the two lists for each of them.
//! It keeps the answer's bytes instead ([`AliveAnswer::encoded`]), which each task's answer
//! writes out verbatim: on the wire exactly XLA's message, and it decodes as XLA's message, so
//! clients read it as before.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{fixed64, int32, skip_field, DecodeContext, WireType};
use prost::DecodeError;

/// `xla.coordination.GetAliveTasksResponse` (see the module doc).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct AliveAnswer {
    /// Field 1.
    pub alive_task_ids: Vec<i32>,
    /// Field 2.
    pub incarnations: Vec<u64>,
    /// The whole message already encoded, written after the fields above (which are then
    /// empty). Empty when decoded: a decoded answer has its fields in the two above.
    pub encoded: Bytes,
}

impl prost::Message for AliveAnswer {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        int32::encode_packed(1, &self.alive_task_ids, buf);
        fixed64::encode_packed(2, &self.incarnations, buf);
        buf.put_slice(&self.encoded);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            1 => int32::merge_repeated(wire_type, &mut self.alive_task_ids, buf, ctx),
            2 => fixed64::merge_repeated(wire_type, &mut self.incarnations, buf, ctx),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        int32::encoded_len_packed(1, &self.alive_task_ids)
            + fixed64::encoded_len_packed(2, &self.incarnations)
            + self.encoded.len()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// What prost generates from XLA's schema, to hold the hand-written message up against.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(int32, repeated, tag = "1")]
        alive_task_ids: Vec<i32>,
        #[prost(fixed64, repeated, tag = "2")]
        incarnations: Vec<u64>,
    }

    #[test]
    fn encoded_once_is_the_schemas_bytes_and_decodes_as_built() {
        let generated = Generated {
            alive_task_ids: vec![0, 2, 300],
            incarnations: vec![7, u64::MAX, 1 << 40],
        };
        let built = AliveAnswer {
            alive_task_ids: generated.alive_task_ids.clone(),
            incarnations: generated.incarnations.clone(),
            encoded: Bytes::new(),
        };
        let bytes = generated.encode_to_vec();
        assert_eq!(built.encode_to_vec(), bytes);
        assert_eq!(built.encoded_len(), bytes.len());
        let shared = AliveAnswer {
            encoded: Bytes::from(bytes.clone()),
            ..Default::default()
        };
        assert_eq!(shared.encode_to_vec(), bytes, "written out verbatim");
        assert_eq!(shared.encoded_len(), bytes.len());
        assert_eq!(AliveAnswer::decode(&bytes[..]).expect("decodes"), built);
        assert_eq!(
            AliveAnswer::decode(&[][..]).expect("empty"),
            AliveAnswer::default()
        );
    }
}

//! TensorFlow's `WaitForAllTasksResponse`, able to carry a device list encoded once.
//!
//! Every task of a job waits for the same answer: the whole job's devices. Built and encoded per
//! caller, a job of N tasks costs N² device encodings (and N² allocations) on the service. The
//! service encodes the list once per change and hands each caller those bytes ([`WaitAnswer::encoded`]),
//! which the answer copies out verbatim. On the wire it is exactly TensorFlow's message: a message
//! field and the same field's encoding are the same bytes. It decodes as TensorFlow's message too,
//! so clients and the proxy read it as before.
//!
//! Generic over the two device messages, which the schema's module names
//! (`tensorflow::WaitForAllTasksResponse`), so that this file needs nothing of it.

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{fixed64, message, skip_field, DecodeContext, WireType};
use prost::DecodeError;

/// `tensorflow.WaitForAllTasksResponse` with `D` = `DeviceInfo` and `C` =
/// `CoordinationServiceDeviceInfo` (see the module doc).
#[derive(Clone, PartialEq, Default, Debug)]
pub struct WaitAnswer<D, C> {
    /// Field 1.
    pub leader_incarnation: u64,
    /// Field 4: TF 2.21's device list.
    pub device_info: Option<D>,
    /// Field 3: what releases before 2.1x read (reserved in 2.21).
    pub cluster_device_info: Option<C>,
    /// Fields already encoded, tags included (see [`encoded_field`]), written after the others.
    /// Empty when decoded: a decoded answer has its fields in the two above.
    pub encoded: Bytes,
}

/// Field `tag` holding `m`, encoded: what [`WaitAnswer::encoded`] carries.
pub fn encoded_field(tag: u32, m: &impl prost::Message) -> Bytes {
    let mut buf = Vec::with_capacity(message::encoded_len(tag, m));
    message::encode(tag, m, &mut buf);
    buf.into()
}

impl<D, C> prost::Message for WaitAnswer<D, C>
where
    D: prost::Message + Default,
    C: prost::Message + Default,
{
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if self.leader_incarnation != 0 {
            fixed64::encode(1, &self.leader_incarnation, buf);
        }
        if let Some(m) = &self.cluster_device_info {
            message::encode(3, m, buf);
        }
        if let Some(m) = &self.device_info {
            message::encode(4, m, buf);
        }
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
            1 => fixed64::merge(wire_type, &mut self.leader_incarnation, buf, ctx),
            3 => message::merge(
                wire_type,
                self.cluster_device_info
                    .get_or_insert_with(Default::default),
                buf,
                ctx,
            ),
            4 => message::merge(
                wire_type,
                self.device_info.get_or_insert_with(Default::default),
                buf,
                ctx,
            ),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let incarnation = if self.leader_incarnation != 0 {
            fixed64::encoded_len(1, &self.leader_incarnation)
        } else {
            0
        };
        incarnation
            + self
                .cluster_device_info
                .as_ref()
                .map_or(0, |m| message::encoded_len(3, m))
            + self
                .device_info
                .as_ref()
                .map_or(0, |m| message::encoded_len(4, m))
            + self.encoded.len()
    }

    fn clear(&mut self) {
        self.leader_incarnation = 0;
        self.device_info = None;
        self.cluster_device_info = None;
        self.encoded = Bytes::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Stand-ins for the schema's device messages: a list of byte strings, and one string.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Devices {
        #[prost(bytes = "vec", repeated, tag = "1")]
        device: Vec<Vec<u8>>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Older {
        #[prost(string, tag = "1")]
        kind: String,
    }

    type Answer = WaitAnswer<Devices, Older>;

    fn devices() -> Devices {
        Devices {
            device: (0..3).map(|i| vec![i; 20]).collect(),
        }
    }

    #[test]
    fn encoded_once_is_the_same_bytes_and_decodes_as_built() {
        let built = Answer {
            leader_incarnation: 7,
            device_info: Some(devices()),
            ..Default::default()
        };
        let shared = Answer {
            leader_incarnation: 7,
            encoded: encoded_field(4, &devices()),
            ..Default::default()
        };
        assert_eq!(built.encode_to_vec(), shared.encode_to_vec());
        assert_eq!(shared.encoded_len(), shared.encode_to_vec().len());
        let decoded = Answer::decode(&shared.encode_to_vec()[..]).expect("decodes");
        assert_eq!(decoded, built);
        let older = Answer {
            encoded: encoded_field(3, &Older { kind: "tf".into() }),
            ..Default::default()
        };
        let decoded = Answer::decode(&older.encode_to_vec()[..]).expect("decodes");
        assert_eq!(
            decoded.cluster_device_info.map(|o| o.kind).as_deref(),
            Some("tf")
        );
    }

    #[test]
    fn unknown_fields_are_skipped() {
        // Field 2 (reserved) and field 9: a reader of TF 2.21's schema skips both.
        let mut wire = vec![0x10, 0x05, 0x4a, 0x01, 0x00];
        wire.extend(
            Answer {
                leader_incarnation: 3,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let decoded = Answer::decode(&wire[..]).expect("decodes");
        assert_eq!(decoded.leader_incarnation, 3);
    }
}

//! Rendezvous keys in TensorFlow's format, and the device names inside them.
//!
//! A key names one tensor of one step:
//! `src_device;src_incarnation;dst_device;tensor_name;frame_id:iter_id`, where the incarnation is
//! 16 hexadecimal digits (TF's `FpToString`) and the devices are full device names such as
//! `/job:worker/replica:0/task:1/device:CPU:0`. [`ParsedKey::parse`] refuses anything else with a
//! message that names the offending part: a key comes off the network.

use std::fmt;

/// A full device name: `/job:NAME/replica:R/task:T/device:TYPE:ID`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceName {
    pub job: String,
    pub replica: u32,
    pub task: u32,
    pub device_type: String,
    pub device_id: u32,
}

impl DeviceName {
    /// Parses a full device name. The legacy short form of the last part (`/cpu:0`, `/gpu:1`) is
    /// accepted, as TensorFlow accepts it, and read as `device:CPU:0`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("device name {s:?}: {why}");
        let rest = s
            .strip_prefix('/')
            .ok_or_else(|| bad("must start with '/'"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [job, replica, task, device] = parts.as_slice() else {
            return Err(bad("expected /job:NAME/replica:R/task:T/device:TYPE:ID"));
        };
        let field = |part: &str, prefix: &str| -> Result<String, String> {
            part.strip_prefix(prefix)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .ok_or_else(|| bad(&format!("expected {prefix}… where {part:?} is")))
        };
        let number = |part: &str, prefix: &str| -> Result<u32, String> {
            field(part, prefix)?
                .parse()
                .map_err(|_| bad(&format!("{part:?} is not {prefix}<number>")))
        };
        let job = field(job, "job:")?;
        if !job
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
            return Err(bad(
                "a job name may hold only letters, digits, '_', '-' and '.'",
            ));
        }
        let (device_type, id) = match device.strip_prefix("device:") {
            Some(d) => d
                .rsplit_once(':')
                .ok_or_else(|| bad("expected device:TYPE:ID"))?,
            None => device
                .rsplit_once(':')
                .filter(|(t, _)| matches!(*t, "cpu" | "gpu" | "tpu"))
                .ok_or_else(|| bad("expected device:TYPE:ID"))?,
        };
        if device_type.is_empty()
            || !device_type
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            return Err(bad(&format!("bad device type {device_type:?}")));
        }
        Ok(Self {
            job,
            replica: number(replica, "replica:")?,
            task: number(task, "task:")?,
            device_type: device_type.to_ascii_uppercase(),
            device_id: id
                .parse()
                .map_err(|_| bad(&format!("bad device id {id:?}")))?,
        })
    }

    /// The task the device belongs to, `/job:NAME/replica:R/task:T`.
    pub fn task_name(&self) -> String {
        task_name(&self.job, self.replica, self.task)
    }
}

/// `/job:NAME/replica:R/task:T`.
pub fn task_name(job: &str, replica: u32, task: u32) -> String {
    format!("/job:{job}/replica:{replica}/task:{task}")
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/device:{}:{}",
            self.task_name(),
            self.device_type,
            self.device_id
        )
    }
}

/// A parsed rendezvous key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ParsedKey {
    pub src: DeviceName,
    pub src_incarnation: u64,
    pub dst: DeviceName,
    pub edge_name: String,
    pub frame_id: u64,
    pub iter_id: u64,
    /// The key as it was given (the table key of a rendezvous).
    full: String,
}

/// Longest key accepted.
pub const MAX_KEY_BYTES: usize = 4096;

impl ParsedKey {
    /// Builds the key TensorFlow's `Rendezvous::CreateKey` would.
    pub fn create(
        src: &DeviceName,
        src_incarnation: u64,
        dst: &DeviceName,
        edge_name: &str,
        frame_id: u64,
        iter_id: u64,
    ) -> Result<Self, String> {
        Self::parse(&format!(
            "{src};{src_incarnation:016x};{dst};{edge_name};{frame_id}:{iter_id}"
        ))
    }

    pub fn parse(key: &str) -> Result<Self, String> {
        let bad = |why: String| format!("malformed rendezvous key {key:?}: {why}");
        if key.len() > MAX_KEY_BYTES {
            return Err(format!(
                "malformed rendezvous key: {} bytes, more than {MAX_KEY_BYTES}",
                key.len()
            ));
        }
        let parts: Vec<&str> = key.split(';').collect();
        let [src, incarnation, dst, edge, frame_iter] = parts.as_slice() else {
            return Err(bad(format!(
                "{} ';'-separated parts, expected 5 (src_device;src_incarnation;dst_device;tensor_name;frame_id:iter_id)",
                parts.len()
            )));
        };
        let src = DeviceName::parse(src).map_err(bad)?;
        let dst = DeviceName::parse(dst).map_err(bad)?;
        if incarnation.is_empty() || incarnation.len() > 16 {
            return Err(bad(format!(
                "incarnation {incarnation:?} is not 1 to 16 hex digits"
            )));
        }
        let src_incarnation = u64::from_str_radix(incarnation, 16)
            .map_err(|_| bad(format!("incarnation {incarnation:?} is not hexadecimal")))?;
        if edge.is_empty() {
            return Err(bad("the tensor name is empty".into()));
        }
        let (frame, iter) = frame_iter
            .split_once(':')
            .ok_or_else(|| bad(format!("{frame_iter:?} is not frame_id:iter_id")))?;
        let number = |v: &str, what: &str| {
            v.parse::<u64>()
                .map_err(|_| bad(format!("{what} {v:?} is not a number")))
        };
        Ok(Self {
            src,
            src_incarnation,
            dst,
            edge_name: edge.to_string(),
            frame_id: number(frame, "frame id")?,
            iter_id: number(iter, "iteration id")?,
            full: key.to_string(),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.full
    }
}

impl fmt::Display for ParsedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "/job:worker/replica:0/task:1/device:CPU:0";
    const DST: &str = "/job:worker/replica:0/task:2/device:GPU:3";

    #[test]
    fn keys_round_trip_in_tensorflows_format() {
        let src = DeviceName::parse(SRC).expect("src");
        let dst = DeviceName::parse(DST).expect("dst");
        let key = ParsedKey::create(&src, 0xabc, &dst, "edge_5_x", 0, 7).expect("create");
        assert_eq!(
            key.as_str(),
            format!("{SRC};0000000000000abc;{DST};edge_5_x;0:7")
        );
        let parsed = ParsedKey::parse(key.as_str()).expect("parse");
        assert_eq!(parsed, key);
        assert_eq!(parsed.src.task_name(), "/job:worker/replica:0/task:1");
        assert_eq!(parsed.dst.device_type, "GPU");
        assert_eq!((parsed.frame_id, parsed.iter_id), (0, 7));
        // TF's legacy short device form.
        let legacy = DeviceName::parse("/job:ps/replica:0/task:0/cpu:0").expect("legacy");
        assert_eq!(legacy.to_string(), "/job:ps/replica:0/task:0/device:CPU:0");
    }

    /// Keys mutated at random, and strings made of key characters: the parser never panics, and
    /// whatever it accepts it gives back unchanged and would build the same way.
    #[test]
    fn fuzz_the_parser_never_panics_and_accepts_only_well_formed_keys() {
        let good = format!("{SRC};0000000000000abc;{DST};edge_5_x;0:7");
        let alphabet: Vec<char> = "/;:0123456789abcfxjobreplicatskdvCPUGé_-. "
            .chars()
            .collect();
        let mut next = coord_proto::fuzz::xorshift(0x6B65_7973);
        let mut accepted = 0;
        for round in 0..20_000u32 {
            let key: String = if round.is_multiple_of(2) {
                let mut chars: Vec<char> = good.chars().collect();
                for _ in 0..1 + next() % 3 {
                    let at = (next() as usize) % chars.len();
                    let c = alphabet[(next() as usize) % alphabet.len()];
                    match next() % 3 {
                        0 => chars[at] = c,
                        1 => chars.insert(at, c),
                        _ => {
                            chars.remove(at);
                        }
                    }
                }
                chars.into_iter().collect()
            } else {
                (0..next() % 120)
                    .map(|_| alphabet[(next() as usize) % alphabet.len()])
                    .collect()
            };
            if let Ok(k) = ParsedKey::parse(&key) {
                accepted += 1;
                assert_eq!(k.as_str(), key);
                let rebuilt = ParsedKey::create(
                    &k.src,
                    k.src_incarnation,
                    &k.dst,
                    &k.edge_name,
                    k.frame_id,
                    k.iter_id,
                )
                .expect("an accepted key's parts build a key");
                assert_eq!(rebuilt.src, k.src);
                assert_eq!(rebuilt.dst, k.dst);
                assert_eq!(rebuilt.edge_name, k.edge_name);
            }
        }
        assert!(accepted > 100, "only {accepted} mutated keys parsed");
    }

    #[test]
    fn malformed_keys_are_refused_naming_the_part() {
        let good = format!("{SRC};0000000000000001;{DST};t;0:0");
        assert!(ParsedKey::parse(&good).is_ok());
        for (key, expect) in [
            (String::new(), "expected 5"),
            (format!("{SRC};1;{DST};t"), "expected 5"),
            (format!("{SRC};1;{DST};t;0:0;extra"), "expected 5"),
            (
                format!("job:w/replica:0/task:1/device:CPU:0;1;{DST};t;0:0"),
                "must start with '/'",
            ),
            (
                format!("/job:w/task:1/device:CPU:0;1;{DST};t;0:0"),
                "expected /job:NAME",
            ),
            (
                format!("/job:w/replica:x/task:1/device:CPU:0;1;{DST};t;0:0"),
                "replica:<number>",
            ),
            (
                format!("/job:w b/replica:0/task:1/device:CPU:0;1;{DST};t;0:0"),
                "job name",
            ),
            (
                format!("/job:w/replica:0/task:1/device:CPU;1;{DST};t;0:0"),
                "device:TYPE:ID",
            ),
            (format!("{SRC};xyz;{DST};t;0:0"), "not hexadecimal"),
            (format!("{SRC};;{DST};t;0:0"), "1 to 16 hex digits"),
            (
                format!("{SRC};00000000000000001;{DST};t;0:0"),
                "1 to 16 hex digits",
            ),
            (format!("{SRC};1;{DST};;0:0"), "tensor name is empty"),
            (format!("{SRC};1;{DST};t;0"), "frame_id:iter_id"),
            (format!("{SRC};1;{DST};t;0:-1"), "iteration id"),
            ("x".repeat(MAX_KEY_BYTES + 1), "bytes, more than"),
        ] {
            let err = ParsedKey::parse(&key).expect_err(&key);
            assert!(err.contains(expect), "{key:?}: {err:?} lacks {expect:?}");
        }
    }
}

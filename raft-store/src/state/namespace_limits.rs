//! A namespace's name and limits: records that commands carry (see `state::namespaces` for the
//! namespaces themselves).
//!
//! Names are checked here, the same way on every replica and in every client, so that no name
//! can stand for another: one to [`MAX_NAME_BYTES`] of ASCII letters, digits, `-`, `_` and `.`,
//! starting with a letter or digit. No `/`, so no name is a prefix path of another and `A/..`
//! names nothing; [`DEFAULT_NAMESPACE`] is the replicas' own namespace, never a named one.

use serde::{Deserialize, Serialize};

/// The name that means the default namespace (the one the replicas' job flags define).
pub const DEFAULT_NAMESPACE: &str = "default";
/// The longest name: a Kubernetes label value's limit, so a controller uid always fits.
pub const MAX_NAME_BYTES: usize = 63;

/// Why `name` cannot name a namespace, if it cannot.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Some(format!(
            "namespace name {:?} must be 1 to {MAX_NAME_BYTES} bytes",
            shown(name)
        ));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Some(format!(
            "namespace name {:?} must start with a letter or digit",
            shown(name)
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Some(format!(
            "namespace name {:?} holds {c:?}: only letters, digits, '-', '_' and '.' are allowed",
            shown(name)
        ));
    }
    None
}

fn shown(name: &str) -> String {
    name.chars().take(80).collect()
}

/// What one namespace may hold and do. 0 in any field: no limit. Every replica checks the byte
/// and key limits in apply; the leader checks the others before a call is served or a write
/// proposed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NamespaceLimits {
    /// Bytes of state (keys, values and records, counted as the ensemble's quota counts them).
    pub max_bytes: u64,
    /// Keys, path and raw.
    pub max_keys: u64,
    /// Tasks of its job.
    pub max_tasks: u64,
    /// Calls parked on the leader (blocking gets, barriers, waits) and watch streams, together.
    pub max_parked: u64,
    /// Writes per second, sustained (a token bucket on the leader).
    pub writes_per_sec: u64,
    /// Writes allowed at once above the rate: the bucket's depth.
    pub write_burst: u64,
    /// The namespace is deleted this long after its last task disconnected (0: kept).
    pub ttl_ms: u64,
}

impl NamespaceLimits {
    /// The fields that differ from `other`, as `name: ours (other: theirs)`.
    pub fn differences(&self, other: &Self) -> Vec<String> {
        let fields = [
            ("max_bytes", self.max_bytes, other.max_bytes),
            ("max_keys", self.max_keys, other.max_keys),
            ("max_tasks", self.max_tasks, other.max_tasks),
            ("max_parked", self.max_parked, other.max_parked),
            ("writes_per_sec", self.writes_per_sec, other.writes_per_sec),
            ("write_burst", self.write_burst, other.write_burst),
            ("ttl_ms", self.ttl_ms, other.ttl_ms),
        ];
        fields
            .into_iter()
            .filter(|(_, a, b)| a != b)
            .map(|(name, a, b)| format!("{name} {a} (declared: {b})"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_stand_for_another_are_refused() {
        for good in [
            "a",
            "job-7",
            "3b7e1c2a-9f4e-4f3a-8d1e-0c5b6a7d8e9f",
            "run_1.2",
        ] {
            assert_eq!(name_problem(good), None, "{good}");
        }
        for bad in [
            "",
            "a/b",
            "A/..",
            "..",
            ".a",
            "-a",
            "a b",
            "ä",
            &"x".repeat(64),
        ] {
            assert!(name_problem(bad).is_some(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn differences_name_each_field() {
        let a = NamespaceLimits {
            max_keys: 10,
            ..Default::default()
        };
        let b = NamespaceLimits {
            max_keys: 20,
            ttl_ms: 5,
            ..Default::default()
        };
        assert_eq!(
            a.differences(&b),
            ["max_keys 10 (declared: 20)", "ttl_ms 0 (declared: 5)"]
        );
    }
}

//! The replicated key-value store.
//!
//! Every mutation takes the next revision, a counter kept in the state itself, so all replicas
//! number the same change the same way; watchers resume from the last revision they saw.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::change::Change;
use super::quota::KV_ENTRY_OVERHEAD;
use crate::command::{CommandResult, Output};
use crate::error::OpError;
use crate::key::{dir_range, normalized};
use crate::raw::{RawKeys, RawOp, RawOutput};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(from = "KvStoreWire")]
pub struct KvStore {
    entries: BTreeMap<String, KvEntry>,
    /// The revision of the last change; 0 before the first.
    revision: u64,
    /// What the entries count against the quota (see `quota`): derived from them, so not
    /// stored; kept as they change.
    #[serde(skip)]
    bytes: u64,
    /// The raw key space (torch's store keys, taken as their bytes; see `crate::raw`): apart
    /// from the path keys above, without revisions (nothing watches it). Snapshots before
    /// format 6 lack it.
    raw: RawKeys,
}

/// A store as snapshots hold it.
#[derive(Deserialize)]
struct KvStoreWire {
    entries: BTreeMap<String, KvEntry>,
    revision: u64,
    raw: RawKeys,
}

impl From<KvStoreWire> for KvStore {
    fn from(w: KvStoreWire) -> Self {
        let mut store = KvStore::from(KvStoreBeforeRaw {
            entries: w.entries,
            revision: w.revision,
        });
        store.raw = w.raw;
        store
    }
}

/// A store as snapshots before format 6 hold it: path keys only.
#[derive(Serialize, Deserialize)]
pub struct KvStoreBeforeRaw {
    entries: BTreeMap<String, KvEntry>,
    revision: u64,
}

impl From<KvStoreBeforeRaw> for KvStore {
    fn from(w: KvStoreBeforeRaw) -> Self {
        let bytes = w
            .entries
            .iter()
            .map(|(k, e)| entry_bytes(k, &e.value))
            .sum();
        KvStore {
            entries: w.entries,
            revision: w.revision,
            bytes,
            raw: RawKeys::default(),
        }
    }
}

/// What one entry counts against the quota.
fn entry_bytes(key: &str, value: &Bytes) -> u64 {
    (key.len() + value.len()) as u64 + KV_ENTRY_OVERHEAD
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct KvEntry {
    pub value: Bytes,
    /// Revision of the change that created the key.
    pub create_revision: u64,
    /// Revision of the latest change to the key.
    pub mod_revision: u64,
}

impl KvStore {
    pub fn get(&self, key: &str) -> Option<&KvEntry> {
        self.entries.get(key)
    }

    /// Entries strictly under directory `dir` (keys starting with `dir/`), in key order.
    pub fn list_dir<'a>(&'a self, dir: &str) -> impl Iterator<Item = (&'a String, &'a KvEntry)> {
        let (lo, hi) = dir_range(dir);
        self.entries.range(lo..hi)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// What the entries, path and raw, count against the quota.
    pub fn bytes(&self) -> u64 {
        self.bytes + self.raw.bytes()
    }

    /// The store without its raw keys, as snapshots before format 6 held it (for tests of
    /// those formats).
    #[cfg(test)]
    pub(crate) fn to_before_raw(&self) -> KvStoreBeforeRaw {
        KvStoreBeforeRaw {
            entries: self.entries.clone(),
            revision: self.revision,
        }
    }

    /// The raw key space.
    pub fn raw(&self) -> &RawKeys {
        &self.raw
    }

    /// Applies a mutation of the raw key space; each key it touched is reported.
    pub(crate) fn apply_raw(&mut self, op: &RawOp, changes: &mut Vec<Change>) -> CommandResult {
        let mut touched = Vec::new();
        let out: RawOutput = self.raw.apply(op, &mut touched)?;
        changes.extend(touched.into_iter().map(|key| Change::RawChanged { key }));
        Ok(Output::Raw(out))
    }

    /// How many bytes a put would add to [`Self::bytes`] (0 if it would not grow the store or
    /// would fail).
    pub(crate) fn growth_of_put(&self, key: &str, value: &Bytes, overwrite: bool) -> u64 {
        let key = normalized(key);
        match self.entries.get(key.as_ref()) {
            Some(e) if overwrite => (value.len() as u64).saturating_sub(e.value.len() as u64),
            Some(_) => 0,
            None if key.is_empty() => 0,
            None => entry_bytes(&key, value),
        }
    }

    /// How many bytes an increment would add: a new key's, with room for any number.
    pub(crate) fn growth_of_increment(&self, key: &str) -> u64 {
        let key = normalized(key);
        if key.is_empty() || self.entries.contains_key(key.as_ref()) {
            0
        } else {
            entry_bytes(&key, &Bytes::from_static(b"-9223372036854775808"))
        }
    }

    fn remove_entry(&mut self, key: &str) {
        if let Some(e) = self.entries.remove(key) {
            self.bytes -= entry_bytes(key, &e.value);
        }
    }

    fn next_revision(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    pub(crate) fn put(
        &mut self,
        key: &str,
        value: &Bytes,
        overwrite: bool,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        let key = normalized(key);
        if key.is_empty() {
            return Err(OpError::EmptyKey);
        }
        if !overwrite && self.entries.contains_key(key.as_ref()) {
            return Err(OpError::AlreadyExists {
                key: key.into_owned(),
            });
        }
        self.store(key.into_owned(), value.clone(), changes);
        Ok(Output::Done)
    }

    pub(crate) fn delete(&mut self, key: &str, changes: &mut Vec<Change>) -> CommandResult {
        let key = normalized(key).into_owned();
        if key.is_empty() {
            return Err(OpError::EmptyKey);
        }
        let (lo, hi) = dir_range(&key);
        let mut doomed: Vec<String> = self.entries.range(lo..hi).map(|(k, _)| k.clone()).collect();
        if self.entries.contains_key(&key) {
            doomed.insert(0, key);
        }
        for k in &doomed {
            self.remove_entry(k);
            let revision = self.next_revision();
            changes.push(Change::KvDelete {
                key: k.clone(),
                revision,
            });
        }
        Ok(Output::Deleted(doomed.len() as u64))
    }

    /// Deletes every key last written at a revision in `(after, until]`: a run's keys (see
    /// `runs`).
    pub(crate) fn remove_modified_in(&mut self, after: u64, until: u64, changes: &mut Vec<Change>) {
        let doomed: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| e.mod_revision > after && e.mod_revision <= until)
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.remove_entry(&k);
            let revision = self.next_revision();
            changes.push(Change::KvDelete { key: k, revision });
        }
    }

    pub(crate) fn increment(
        &mut self,
        key: &str,
        delta: i64,
        changes: &mut Vec<Change>,
    ) -> CommandResult {
        let key = normalized(key).into_owned();
        if key.is_empty() {
            return Err(OpError::EmptyKey);
        }
        let current = match self.entries.get(&key) {
            None => 0,
            Some(e) => std::str::from_utf8(&e.value)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| OpError::NotAnInteger { key: key.clone() })?,
        };
        let total = current
            .checked_add(delta)
            .ok_or_else(|| OpError::Overflow {
                key: key.clone(),
                delta,
            })?;
        let value = Bytes::from(total.to_string());
        self.store(key, value.clone(), changes);
        Ok(Output::Value(value))
    }

    fn store(&mut self, key: String, value: Bytes, changes: &mut Vec<Change>) {
        use std::collections::btree_map::Entry;
        let revision = self.next_revision();
        changes.push(Change::KvPut {
            key: key.clone(),
            value: value.clone(),
            revision,
        });
        match self.entries.entry(key) {
            Entry::Occupied(mut e) => {
                let e = e.get_mut();
                self.bytes = self.bytes + value.len() as u64 - e.value.len() as u64;
                e.value = value;
                e.mod_revision = revision;
            }
            Entry::Vacant(e) => {
                self.bytes += entry_bytes(e.key(), &value);
                e.insert(KvEntry {
                    value,
                    create_revision: revision,
                    mod_revision: revision,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(kv: &mut KvStore, k: &str, v: &str, overwrite: bool) -> CommandResult {
        kv.put(k, &Bytes::from(v.to_string()), overwrite, &mut Vec::new())
    }

    #[test]
    fn insert_refuses_existing_key_unless_overwrite() {
        let mut kv = KvStore::default();
        assert_eq!(put(&mut kv, "a", "1", false), Ok(Output::Done));
        assert_eq!(
            put(&mut kv, "/a/", "2", false),
            Err(OpError::AlreadyExists { key: "a".into() })
        );
        assert_eq!(kv.get("a").map(|e| e.value.clone()), Some(Bytes::from("1")));
        assert_eq!(put(&mut kv, "a", "2", true), Ok(Output::Done));
        let e = kv.get("a").cloned();
        assert_eq!(e.as_ref().map(|e| e.value.clone()), Some(Bytes::from("2")));
        assert_eq!(e.map(|e| (e.create_revision, e.mod_revision)), Some((1, 2)));
    }

    #[test]
    fn delete_removes_key_and_subtree_only() {
        let mut kv = KvStore::default();
        for k in ["d", "d/x", "d/y/z", "dd", "d0", "e"] {
            put(&mut kv, k, "v", false).ok();
        }
        let mut changes = Vec::new();
        assert_eq!(kv.delete("d", &mut changes), Ok(Output::Deleted(3)));
        let left: Vec<_> = ["d", "d/x", "d/y/z", "dd", "d0", "e"]
            .into_iter()
            .filter(|k| kv.get(k).is_some())
            .collect();
        assert_eq!(left, vec!["dd", "d0", "e"]);
        assert_eq!(changes.len(), 3);
        assert_eq!(kv.delete("nothing", &mut changes), Ok(Output::Deleted(0)));
    }

    #[test]
    fn list_dir_is_sorted_and_excludes_the_dir_key() {
        let mut kv = KvStore::default();
        for k in ["job/b", "job", "job/a/1", "jobs/x", "job/c"] {
            put(&mut kv, k, "v", false).ok();
        }
        let keys: Vec<_> = kv.list_dir("job").map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, vec!["job/a/1", "job/b", "job/c"]);
    }

    #[test]
    fn increment_creates_parses_and_rejects() {
        let mut kv = KvStore::default();
        let mut ch = Vec::new();
        assert_eq!(kv.increment("n", 5, &mut ch), Ok(Output::Value("5".into())));
        assert_eq!(
            kv.increment("n", -7, &mut ch),
            Ok(Output::Value("-2".into()))
        );
        put(&mut kv, "s", "abc", false).ok();
        assert_eq!(
            kv.increment("s", 1, &mut ch),
            Err(OpError::NotAnInteger { key: "s".into() })
        );
        put(&mut kv, "big", &i64::MAX.to_string(), false).ok();
        assert!(matches!(
            kv.increment("big", 1, &mut ch),
            Err(OpError::Overflow { .. })
        ));
        assert_eq!(
            kv.get("big").map(|e| e.value.clone()),
            Some(Bytes::from(i64::MAX.to_string()))
        );
    }

    #[test]
    fn empty_key_is_rejected_without_change() {
        let mut kv = KvStore::default();
        let mut ch = Vec::new();
        assert_eq!(
            kv.put("//", &Bytes::new(), false, &mut ch),
            Err(OpError::EmptyKey)
        );
        assert_eq!(kv.delete("", &mut ch), Err(OpError::EmptyKey));
        assert!(ch.is_empty());
        assert_eq!(kv.revision(), 0);
    }
}

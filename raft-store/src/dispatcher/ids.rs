//! Ids: one counter per kind, from TensorFlow's bases, skipping ids already held (a client may
//! choose its dataset's id, and coord's dispatcher of before left its own ids behind).
//!
//! While an update of that dispatcher is replayed from an old log, its new objects get the ids it
//! gave them: one counter shared by every kind ([`LegacyIds::last_id`]), so that its clients,
//! which were answered with those ids, still find their objects. An id another object already
//! holds is given a fresh one instead, noted in [`LegacyIds::remap`].

use super::{DispatcherState, LegacyIds};

/// The kinds of ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Dataset,
    Iteration,
    Client,
    Task,
    Job,
}

impl DispatcherState {
    pub(super) fn taken(&self, kind: Kind, id: i64) -> bool {
        match kind {
            Kind::Dataset => self.datasets.contains_key(&id.to_string()),
            Kind::Iteration => self.iterations.contains_key(&id),
            Kind::Client => self.clients.contains_key(&id),
            Kind::Task => self.tasks.contains_key(&id),
            Kind::Job => self.jobs.contains_key(&id),
        }
    }

    /// The next free id of `kind` by its own counter.
    pub(super) fn fresh_id(&mut self, kind: Kind) -> i64 {
        loop {
            let next = match kind {
                Kind::Dataset => &mut self.next.dataset,
                Kind::Iteration => &mut self.next.iteration,
                Kind::Client => &mut self.next.client,
                Kind::Task => &mut self.next.task,
                Kind::Job => &mut self.next.job,
            };
            let id = *next;
            *next = next.saturating_add(1);
            if !self.taken(kind, id) {
                return id;
            }
        }
    }

    /// The id of a new object of `kind`: its counter's, or, while an update of coord's
    /// dispatcher of before is replayed, the one that dispatcher gave it.
    pub(super) fn new_id(&mut self, kind: Kind) -> i64 {
        if !self.replaying_legacy {
            return self.fresh_id(kind);
        }
        let legacy = self.legacy.get_or_insert_with(LegacyIds::default);
        legacy.last_id += 1;
        let old = legacy.last_id;
        match i64::try_from(old) {
            Ok(id) if !self.taken(kind, id) => id,
            _ => {
                let id = self.fresh_id(kind);
                if let Some(l) = self.legacy.as_mut() {
                    l.remap.insert(old, id);
                }
                id
            }
        }
    }

    /// A new worker registration number.
    pub(super) fn new_registration(&mut self) -> u64 {
        if self.replaying_legacy {
            let legacy = self.legacy.get_or_insert_with(LegacyIds::default);
            legacy.last_id += 1;
            let id = legacy.last_id;
            self.next.registration = self.next.registration.max(id + 1);
            return id;
        }
        let id = self.next.registration;
        self.next.registration += 1;
        id
    }

    /// What an id of coord's dispatcher of before is now (itself, unless it was given another).
    pub(super) fn legacy_id(&self, old: u64) -> i64 {
        self.legacy
            .as_ref()
            .and_then(|l| l.remap.get(&old).copied())
            .unwrap_or_else(|| i64::try_from(old).unwrap_or(i64::MAX))
    }

    /// Applies `f` as a replay of an update of coord's dispatcher of before.
    pub(super) fn replaying<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        self.replaying_legacy = true;
        let out = f(self);
        self.replaying_legacy = false;
        out
    }
}

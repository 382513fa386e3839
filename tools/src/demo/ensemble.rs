//! The demo's coord ensemble: a [`LocalEnsemble`] whose replicas all run with the demo's flags.
//! Dropping it kills every replica it started; if the demo panics, the directory is kept and the
//! end of every replica's log printed (see [`crate::ensemble`]).
//!
//! The supervisor only starts replicas, finds the leader, and kills and restarts one; everything
//! but the flags is the shared ensemble, which it reaches through `Deref`.

use std::ops::{Deref, DerefMut};

use crate::ensemble::{Layout, LocalEnsemble, DEFAULT_LOG_FILTER};

pub struct Ensemble {
    replicas: LocalEnsemble,
    /// Flags for every replica beyond its addresses and data directory.
    extra_args: Vec<String>,
}

impl Ensemble {
    /// Starts `replicas` replicas (ids 1..=n) with `extra_args`; returns without waiting for a
    /// leader.
    pub fn start(replicas: usize, extra_args: Vec<String>) -> Self {
        let mut e = Self {
            replicas: LocalEnsemble::new(Layout {
                replicas,
                separate_peer_addrs: false,
                log_filter: DEFAULT_LOG_FILTER.into(),
                failure_banner: "the demo failed; ensemble data and logs",
            }),
            extra_args,
        };
        for id in e.ids() {
            e.spawn(id);
        }
        e
    }

    /// Starts (or restarts) replica `id` with the demo's flags.
    pub fn spawn(&mut self, id: u64) {
        let mut args = self.replicas.base_args(id);
        args.extend(self.extra_args.iter().cloned());
        self.replicas.spawn_with(id, &args);
    }
}

impl Deref for Ensemble {
    type Target = LocalEnsemble;

    fn deref(&self) -> &LocalEnsemble {
        &self.replicas
    }
}

impl DerefMut for Ensemble {
    fn deref_mut(&mut self) -> &mut LocalEnsemble {
        &mut self.replicas
    }
}

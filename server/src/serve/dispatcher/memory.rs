//! The dispatcher's leader memory: when each worker and client was last heard from, and the
//! latest round each round-robin job reported. Never journaled (TF does not journal them
//! either); a new leader starts empty and grants everyone a full timeout from its first moment.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct Memory {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    workers: HashMap<String, (u64, Instant)>,
    clients: HashMap<u64, Instant>,
    rounds: HashMap<u64, i64>,
    /// When this replica's leadership began.
    since: Option<Instant>,
    /// Timeouts proposed and not yet seen applied, so each is proposed once.
    proposed_workers: HashSet<(String, u64)>,
    proposed_clients: HashSet<u64>,
}

impl Memory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn worker_heard(&self, address: &str, id: u64) {
        self.lock()
            .workers
            .insert(address.to_string(), (id, Instant::now()));
    }

    pub fn client_heard(&self, client: u64) {
        self.lock().clients.insert(client, Instant::now());
    }

    pub fn forget_client(&self, client: u64) {
        let mut g = self.lock();
        g.clients.remove(&client);
        g.proposed_clients.remove(&client);
    }

    pub fn round_reported(&self, job: u64, round: i64) {
        let mut g = self.lock();
        let r = g.rounds.entry(job).or_insert(round);
        *r = (*r).max(round);
    }

    pub fn rounds(&self) -> BTreeMap<u64, i64> {
        self.lock().rounds.iter().map(|(j, r)| (*j, *r)).collect()
    }

    /// Milliseconds since the worker (registration `id`) was heard from by this leader.
    pub fn worker_silence_ms(&self, address: &str, id: u64) -> Option<u64> {
        match self.lock().workers.get(address) {
            Some((w, at)) if *w == id => Some(at.elapsed().as_millis() as u64),
            _ => None,
        }
    }

    /// Forgets everything: this replica just became leader.
    pub fn start_leading(&self) {
        let mut g = self.lock();
        *g = Inner::default();
        g.since = Some(Instant::now());
    }

    pub fn stop_leading(&self) {
        self.lock().since = None;
    }

    /// Live workers silent past `timeout`, each returned once.
    pub fn overdue_workers(&self, live: &[(String, u64)], timeout: Duration) -> Vec<(String, u64)> {
        let now = Instant::now();
        let mut g = self.lock();
        let Some(since) = g.since else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (address, id) in live {
            let heard = match g.workers.get(address) {
                Some((w, at)) if w == id => (*at).max(since),
                _ => since,
            };
            if now.saturating_duration_since(heard) > timeout
                && g.proposed_workers.insert((address.clone(), *id))
            {
                out.push((address.clone(), *id));
            }
        }
        let live: HashSet<&(String, u64)> = live.iter().collect();
        g.proposed_workers.retain(|w| live.contains(w));
        out
    }

    /// Clients silent past `timeout`, each returned once.
    pub fn overdue_clients(&self, clients: &[u64], timeout: Duration) -> Vec<u64> {
        let now = Instant::now();
        let mut g = self.lock();
        let Some(since) = g.since else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for c in clients {
            let heard = g.clients.get(c).map_or(since, |at| (*at).max(since));
            if now.saturating_duration_since(heard) > timeout && g.proposed_clients.insert(*c) {
                out.push(*c);
            }
        }
        let live: HashSet<&u64> = clients.iter().collect();
        g.proposed_clients.retain(|c| live.contains(c));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_leader_grants_grace_and_judges_once() {
        let m = Memory::default();
        let live = vec![("w:1".to_string(), 3)];
        assert!(
            m.overdue_workers(&live, Duration::ZERO).is_empty(),
            "not leading"
        );
        m.start_leading();
        assert!(m.overdue_workers(&live, Duration::from_secs(60)).is_empty());
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(m.overdue_workers(&live, Duration::from_millis(1)), live);
        assert!(m
            .overdue_workers(&live, Duration::from_millis(1))
            .is_empty());
        // A heartbeat from another registration of the address does not count.
        m.worker_heard("w:1", 4);
        std::thread::sleep(Duration::from_millis(3));
        let again = vec![("w:1".to_string(), 4)];
        assert!(m
            .overdue_workers(&again, Duration::from_secs(60))
            .is_empty());
        assert_eq!(m.overdue_clients(&[9], Duration::from_millis(1)), vec![9]);
    }
}

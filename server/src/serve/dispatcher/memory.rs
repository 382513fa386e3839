//! What TensorFlow's dispatcher keeps in memory, kept in the leader's: when each worker and
//! client was last heard from, the latest round each round-robin client reported, and
//! consumers' pending requests to remove a task. Never journaled (TF does not journal them
//! either); a new leader starts empty and grants every worker and client a full timeout from its
//! first moment, as TF does after a restart.
//!
//! Each namespace has a dispatcher of its own, so a [`Memory`] of its own ([`Memories::of`]):
//! client ids, task ids and worker addresses of two namespaces never meet.
//!
//! Times are on the replica's clock ([`StallClock`]), as the heartbeat checker measures tasks'
//! silence: a leader that stalled does not declare its workers lost or release its clients for
//! the time it was itself not listening.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use coord_raft_store::dispatcher::DispatcherState;

use super::remover::TaskRemover;
use crate::serve::namespace::Ns;
use crate::serve::stall::StallClock;

/// The leader's memory of every namespace's dispatcher, each made on first use.
#[derive(Default)]
pub struct Memories {
    inner: Mutex<Leading>,
    clock: Arc<StallClock>,
}

#[derive(Default)]
struct Leading {
    /// When this replica's leadership began (`None`: not leading).
    since: Option<Instant>,
    spaces: HashMap<Ns, Arc<Memory>>,
}

impl Memories {
    fn lock(&self) -> std::sync::MutexGuard<'_, Leading> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Memories whose times are on `clock`.
    pub fn on(clock: Arc<StallClock>) -> Memories {
        Memories {
            inner: Mutex::default(),
            clock,
        }
    }

    /// Namespace `ns`'s memory (made empty, under this leadership, on first use).
    pub fn of(&self, ns: &Ns) -> Arc<Memory> {
        let mut g = self.lock();
        let since = g.since;
        g.spaces
            .entry(ns.clone())
            .or_insert_with(|| Arc::new(Memory::leading_since(since, self.clock.clone())))
            .clone()
    }

    /// Forgets everything: this replica just became leader.
    pub fn start_leading(&self) {
        *self.lock() = Leading {
            since: Some(self.clock.now()),
            spaces: HashMap::new(),
        };
    }

    pub fn stop_leading(&self) {
        *self.lock() = Leading::default();
    }

    /// The namespaces remembered (those whose dispatchers were judged under this leadership).
    pub fn namespaces(&self) -> Vec<Ns> {
        self.lock().spaces.keys().cloned().collect()
    }

    /// Forgets namespaces `gone` (deleted ones: a name declared again starts afresh).
    pub fn forget(&self, gone: &[Ns]) {
        let mut g = self.lock();
        for ns in gone {
            g.spaces.remove(ns);
        }
    }
}

#[derive(Default)]
pub struct Memory {
    inner: Mutex<Inner>,
    clock: Arc<StallClock>,
}

#[derive(Default)]
struct Inner {
    /// When each client was last heard from; `None` from TensorFlow's GetOrCreateIteration until
    /// its first heartbeat (TF does not release a client before it starts reading).
    clients: HashMap<i64, Option<Instant>>,
    /// The latest round each round-robin client reported (TF's `round_robin_rounds_`).
    rounds: HashMap<i64, i64>,
    workers: HashMap<String, Instant>,
    removers: HashMap<i64, Arc<TaskRemover>>,
    /// When this replica's leadership began.
    since: Option<Instant>,
    /// Releases proposed and not yet seen applied, so each is proposed once.
    proposed_releases: HashSet<i64>,
    /// Workers (address, registration) declared lost and not yet seen applied, likewise.
    proposed_lost: HashSet<(String, u64)>,
}

impl Memory {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A client was just made that is not released before its first heartbeat (TensorFlow's).
    pub fn client_acquired(&self, client: i64) {
        self.lock().clients.insert(client, None);
    }

    /// A client heartbeat (or a coord client's making), with the round it reads now if it reads
    /// round-robin. Returns the latest round heard from it.
    pub fn client_heard(&self, client: i64, current_round: Option<i64>) -> i64 {
        let now = self.clock.now();
        let mut g = self.lock();
        g.clients.insert(client, Some(now));
        let r = g.rounds.entry(client).or_insert(0);
        if let Some(c) = current_round {
            *r = (*r).max(c);
        }
        *r
    }

    pub fn forget_client(&self, client: i64) {
        let mut g = self.lock();
        g.clients.remove(&client);
        g.rounds.remove(&client);
        g.proposed_releases.remove(&client);
    }

    pub fn worker_heard(&self, address: &str) {
        let now = self.clock.now();
        self.lock().workers.insert(address.to_string(), now);
    }

    /// Milliseconds since this leader last heard from the worker.
    pub fn worker_silence_ms(&self, address: &str) -> Option<u64> {
        let now = self.clock.now();
        self.lock().workers.get(address).map(|at| {
            let silence = now.saturating_duration_since(*at);
            u64::try_from(silence.as_millis()).unwrap_or(u64::MAX)
        })
    }

    /// The latest round read by the clients of each iteration: where a task added to a
    /// round-robin iteration starts (one round later).
    pub fn iteration_rounds(&self, s: &DispatcherState) -> BTreeMap<i64, i64> {
        let g = self.lock();
        let mut out = BTreeMap::new();
        for (client, iteration) in &s.clients {
            if let Some(r) = g.rounds.get(client) {
                let e = out.entry(*iteration).or_insert(*r);
                *e = (*e).max(*r);
            }
        }
        out
    }

    /// The agreement of consumers to remove `task`, made on first use.
    pub fn remover(&self, task: i64, consumers: i64) -> Arc<TaskRemover> {
        self.lock()
            .removers
            .entry(task)
            .or_insert_with(|| Arc::new(TaskRemover::new(consumers)))
            .clone()
    }

    /// An empty memory of a leadership that began at `since` on `clock` (`None`: not leading, so
    /// nothing times out).
    fn leading_since(since: Option<Instant>, clock: Arc<StallClock>) -> Memory {
        Memory {
            inner: Mutex::new(Inner {
                since,
                ..Inner::default()
            }),
            clock,
        }
    }

    /// Of `present` workers (address, registration, its timeout), those silent past their
    /// timeout, each returned once.
    pub fn overdue_workers(&self, present: &[(String, u64, Duration)]) -> Vec<(String, u64)> {
        let now = self.clock.now();
        let mut g = self.lock();
        let Some(since) = g.since else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (w, registration, timeout) in present {
            let heard = g.workers.get(w).map_or(since, |at| (*at).max(since));
            let key = (w.clone(), *registration);
            if now.saturating_duration_since(heard) > *timeout
                && g.proposed_lost.insert(key.clone())
            {
                out.push(key);
            }
        }
        let present: HashSet<(&String, u64)> = present.iter().map(|(w, r, _)| (w, *r)).collect();
        g.proposed_lost.retain(|(w, r)| present.contains(&(w, *r)));
        out
    }

    /// Of `active` clients, those silent past `timeout`, each returned once.
    pub fn overdue_clients(&self, active: &[i64], timeout: Duration) -> Vec<i64> {
        let now = self.clock.now();
        let mut g = self.lock();
        let Some(since) = g.since else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for c in active {
            let heard = match g.clients.get(c) {
                Some(None) => continue,
                Some(Some(at)) => (*at).max(since),
                None => since,
            };
            if now.saturating_duration_since(heard) > timeout && g.proposed_releases.insert(*c) {
                out.push(*c);
            }
        }
        let active: HashSet<&i64> = active.iter().collect();
        g.proposed_releases.retain(|c| active.contains(c));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_leader_grants_grace_and_releases_once() {
        assert!(
            Memory::default()
                .overdue_clients(&[1], Duration::ZERO)
                .is_empty(),
            "not leading"
        );
        let m = Memory::leading_since(Some(Instant::now()), Arc::default());
        m.client_acquired(2);
        assert!(m
            .overdue_clients(&[1, 2], Duration::from_secs(60))
            .is_empty());
        std::thread::sleep(Duration::from_millis(3));
        // Client 2 never heartbeated: never released.
        assert_eq!(
            m.overdue_clients(&[1, 2], Duration::from_millis(1)),
            vec![1]
        );
        assert!(m
            .overdue_clients(&[1, 2], Duration::from_millis(1))
            .is_empty());
        m.client_heard(2, Some(4));
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(m.overdue_clients(&[2], Duration::from_millis(1)), vec![2]);
    }

    #[test]
    fn a_silent_worker_is_lost_once_per_registration() {
        let at = |r, ms| vec![("w:1".to_string(), r, Duration::from_millis(ms))];
        assert!(
            Memory::default().overdue_workers(&at(3, 0)).is_empty(),
            "not leading"
        );
        let m = Memory::leading_since(Some(Instant::now()), Arc::default());
        assert!(m.overdue_workers(&at(3, 60_000)).is_empty());
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(m.overdue_workers(&at(3, 1)), vec![("w:1".to_string(), 3)]);
        assert!(m.overdue_workers(&at(3, 1)).is_empty());
        // Its next registration is judged afresh once heard from.
        m.worker_heard("w:1");
        assert!(m.overdue_workers(&at(4, 60_000)).is_empty());
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(m.overdue_workers(&at(4, 1)), vec![("w:1".to_string(), 4)]);
    }

    #[test]
    fn the_leaders_own_stall_is_no_workers_or_clients_silence() {
        let clock = Arc::new(StallClock::default());
        let all = Memories::on(clock.clone());
        all.start_leading();
        let m = all.of(&None);
        let t = Instant::now();
        m.worker_heard("w:1");
        m.client_heard(5, None);
        let timeout = Duration::from_millis(200);
        let workers = vec![("w:1".to_string(), 1, timeout)];
        std::thread::sleep(Duration::from_millis(300));
        // The replica was stalled all that time: its heartbeat checker woke that late.
        clock.woke_late(t.elapsed() + crate::serve::stall::STALL_SLACK);
        assert!(
            m.overdue_workers(&workers).is_empty(),
            "a stall, no silence"
        );
        assert!(m.overdue_clients(&[5], timeout).is_empty());
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(m.overdue_workers(&workers), vec![("w:1".to_string(), 1)]);
        assert_eq!(m.overdue_clients(&[5], timeout), vec![5]);
    }

    #[test]
    fn each_namespace_remembers_apart_under_one_leadership() {
        let all = Memories::default();
        let a: Ns = Some("a".into());
        assert!(
            all.of(&a).overdue_clients(&[1], Duration::ZERO).is_empty(),
            "not leading"
        );
        all.start_leading();
        all.of(&None).client_heard(1, Some(7));
        // A namespace first used after the leadership began times out under it.
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(
            all.of(&a).overdue_clients(&[1], Duration::from_millis(1)),
            vec![1]
        );
        assert_eq!(all.of(&a).client_heard(1, None), 0, "rounds are apart");
        assert_eq!(all.of(&None).client_heard(1, None), 7);
        all.of(&a).client_heard(1, Some(2));
        let mut remembered = all.namespaces();
        remembered.sort();
        assert_eq!(remembered, vec![None, a.clone()]);
        all.forget(std::slice::from_ref(&a));
        assert_eq!(all.namespaces(), vec![None]);
        assert_eq!(all.of(&a).client_heard(1, None), 0, "a deleted name forgot");
        all.stop_leading();
        assert!(all.of(&a).overdue_clients(&[1], Duration::ZERO).is_empty());
    }

    #[test]
    fn rounds_are_the_latest_a_client_reported() {
        let m = Memory::default();
        assert_eq!(m.client_heard(7, Some(5)), 5);
        assert_eq!(m.client_heard(7, Some(3)), 5);
        assert_eq!(m.client_heard(7, None), 5);
        let mut s = DispatcherState::default();
        s.clients.insert(7, 2000);
        s.clients.insert(8, 2000);
        m.client_heard(8, Some(9));
        assert_eq!(m.iteration_rounds(&s), [(2000, 9)].into_iter().collect());
    }
}

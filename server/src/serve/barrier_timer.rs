//! Barrier deadlines, enforced by whichever replica leads.
//!
//! A deadline is an absolute time stored in the barrier record. Every replica hears of new
//! deadlines from apply; only the leader acts on them, by proposing `ExpireBarrier` when its clock
//! passes one (apply checks the instance is still pending and due, so a late or repeated proposal
//! is harmless). A replica that becomes leader rescans the stored deadlines, so a timer armed by a
//! dead leader fires on the new one at the same absolute time. Deadlines of every namespace share
//! the one timer.

use std::collections::BTreeSet;
use std::time::Duration;

use coord_raft_store::storage::StateReader;
use coord_raft_store::Op;
use tokio::sync::mpsc;

use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::apply_hub::Deadline;
use crate::serve::namespace::{self, Ns};
use crate::serve::proposer::{now_ms, Proposer};

/// Runs the leader's barrier timers.
pub async fn run(
    mut deadlines: mpsc::UnboundedReceiver<Deadline>,
    leader: LeaderWatch,
    reader: StateReader,
    proposer: Proposer,
) {
    let mut schedule: BTreeSet<(u64, Ns, String, i64)> = BTreeSet::new();
    let mut leading = false;
    loop {
        let now_leading = leader.current() == Leadership::Me;
        if now_leading && !leading {
            // Re-arm every stored deadline: the old leader's timers died with it.
            reader.read(|a| {
                for (ns, space) in namespace::spaces(a) {
                    let Some(c) = &space.cluster else { continue };
                    for b in c.barriers.pending() {
                        if let Some(at) = b.deadline_ms {
                            schedule.insert((at, ns.clone(), b.id.clone(), b.counter));
                        }
                    }
                }
            });
        }
        leading = now_leading;
        let now = now_ms();
        if leading {
            while let Some(first) = schedule.first().cloned() {
                if first.0 > now {
                    break;
                }
                schedule.remove(&first);
                let (_, ns, id, counter) = first;
                proposer
                    .propose_decision(namespace::bind_to(&ns, Op::ExpireBarrier { id, counter }));
            }
        } else {
            // Followers keep only future deadlines; a new leader rescans anyway.
            schedule.retain(|(at, ..)| *at > now);
        }
        let sleep = schedule
            .first()
            .map_or(Duration::from_millis(200), |(at, ..)| {
                Duration::from_millis(at.saturating_sub(now))
            })
            .min(Duration::from_millis(200));
        tokio::select! {
            d = deadlines.recv() => match d {
                Some(d) => { schedule.insert((d.at_ms, d.ns, d.id, d.counter)); }
                None => return,
            },
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

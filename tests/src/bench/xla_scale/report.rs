//! What `coord-bench xla-scale` measured of each size, and its table: a row per measure, a column
//! per size.

use std::time::Duration;

use super::super::mb;
use super::super::raft_log::{log_cell, LogGrowth};
use super::super::xla_sidecars::SidecarRound;

/// One size's run.
pub struct Measured {
    pub tasks: usize,
    /// Whom the tasks' connections go to: the leader, or a follower that relays their calls.
    pub called: &'static str,
    pub connections: usize,
    pub heartbeat_every: Duration,
    /// RegisterTask: from the first call to the last answer.
    pub register: Duration,
    /// RegisterTask calls answered UNAVAILABLE and made again (each one more log entry).
    pub register_retries: u64,
    pub register_log: LogGrowth,
    pub heartbeat_cpu_cores: f64,
    pub heartbeat_log: LogGrowth,
    pub heartbeat_errors: u64,
    /// GetAliveTasks with each task's own call (none above `--own-alive-max`).
    pub own_alive: Option<OwnAlive>,
    /// The next round, through a sidecar per connection.
    pub through_sidecars: SidecarRound,
    /// An XLA Barrier of the whole job, each task's own call: from the last arrival to every
    /// task's answer.
    pub barrier: Duration,
    /// The same barrier again through the sidecars.
    pub barrier_through_sidecars: SidecarRound,
    /// Every task watching the job's tasks while one leaves (`--watchers`).
    pub watching: Option<super::Watching>,
    /// Tasks leaving while the others ask who is alive (`--stayers`).
    pub leaving: Option<super::Leaving>,
    pub leader_rss_before: u64,
    pub leader_rss_registered: u64,
    /// With every GetAliveTasks call but the last parked (0 without the round of own calls).
    pub leader_rss_parked: u64,
    /// Before the barrier, and with every task's own Barrier call but the last parked.
    pub leader_rss_before_barrier: u64,
    pub leader_rss_barrier_parked: u64,
    pub leader_rss_after: u64,
    pub elections: u64,
}

/// The round of each task's own GetAliveTasks call.
pub struct OwnAlive {
    /// From the last task's call to every task's answer.
    pub alive: Duration,
    /// The answers of every task but the one that decodes its own, as they crossed the wire.
    pub alive_wire_bytes: u64,
    /// The decoded answer: tasks it lists alive, and its encoded size.
    pub alive_listed: usize,
    pub alive_answer_bytes: usize,
    pub alive_log: LogGrowth,
    /// CPU-seconds the replica the tasks call spent over the round, and the answers it
    /// gzip-compressed meanwhile (`coord_answer_compressions_total`).
    pub called_cpu_seconds: f64,
    pub called_compressions: u64,
    /// Through a follower: the waits on the round it sent the leader for its callers
    /// (`coord_relayed_waits_total`; one a round for all of them).
    pub called_round_waits: u64,
    /// Through a follower: the asks it recorded on the leader for its callers, and the calls
    /// that carried them (`coord_relayed_asks_total`, `coord_relayed_ask_calls_total`).
    pub called_asks: u64,
    pub called_ask_calls: u64,
}

/// The table: a row per measure, a column per size.
pub(super) fn print(runs: &[Measured], no_gzip: bool) {
    if runs.is_empty() {
        return;
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let row = |name: &str, cell: &dyn Fn(&Measured) -> String| {
        let cells: Vec<String> = runs.iter().map(cell).collect();
        println!("| {name} | {} |", cells.join(" | "));
    };
    println!();
    let sizes: Vec<String> = runs.iter().map(|m| format!("{} tasks", m.tasks)).collect();
    println!(
        "| measure (3 replicas, jaxlib's XLA wire, no failover) | {} |",
        sizes.join(" | ")
    );
    println!("|---|{}", "---:|".repeat(runs.len()));
    row("connections (tasks share them)", &|m| {
        format!("{} to {}", m.connections, m.called)
    });
    row("RegisterTask storm: first call to last answer", &|m| {
        let s = m.register.as_secs_f64();
        format!("{s:.2} s ({:.0} tasks/s)", m.tasks as f64 / s)
    });
    row(
        "... calls retried after UNAVAILABLE (as jaxlib does)",
        &|m| m.register_retries.to_string(),
    );
    row("... Raft log the registrations wrote (leader)", &|m| {
        log_cell(&m.register_log, Some(m.tasks))
    });
    row("leader CPU with every task heartbeating", &|m| {
        format!(
            "{:.2} cores (every {:?})",
            m.heartbeat_cpu_cores, m.heartbeat_every
        )
    });
    row("... Raft log written meanwhile", &|m| {
        log_cell(&m.heartbeat_log, None)
    });
    row("... failed heartbeats", &|m| m.heartbeat_errors.to_string());
    let gzip = if no_gzip { "" } else { ", gzip accepted" };
    let per_call = |m: &Measured, from: u64, to: u64| {
        let grown = to.saturating_sub(from);
        format!("{:.1} KB", grown as f64 / (m.tasks.max(2) - 1) as f64 / 1e3)
    };
    let own_alive = |m: &Measured, cell: &dyn Fn(&OwnAlive) -> String| {
        m.own_alive.as_ref().map_or("not run".to_string(), cell)
    };
    row(
        &format!("GetAliveTasks of all by all{gzip}, each task's own call: every answer after the last call"),
        &|m| {
            own_alive(m, &|a| {
                format!(
                    "{:.2} s ({} on the wire for {} answers; one is {:.1} KB decoded, {} alive)",
                    a.alive.as_secs_f64(),
                    mb(a.alive_wire_bytes),
                    m.tasks - 1,
                    a.alive_answer_bytes as f64 / 1e3,
                    a.alive_listed
                )
            })
        },
    );
    row("... Raft log the round wrote (leader)", &|m| {
        own_alive(m, &|a| log_cell(&a.alive_log, Some(m.tasks)))
    });
    row(
        "... CPU of the replica the tasks call, over the round; answers it compressed; waits on \
         the leader it sent; asks it recorded there, in calls",
        &|m| {
            own_alive(m, &|a| {
                format!(
                    "{:.2} s; {}; {}; {} in {}",
                    a.called_cpu_seconds,
                    a.called_compressions,
                    a.called_round_waits,
                    a.called_asks,
                    a.called_ask_calls
                )
            })
        },
    );
    row(
        "... leader memory per parked GetAliveTasks call, over heartbeating",
        &|m| {
            own_alive(m, &|_| {
                per_call(m, m.leader_rss_registered, m.leader_rss_parked)
            })
        },
    );
    let through = |r: &SidecarRound| {
        format!(
            "{:.3} s, the sidecars had it after {:.3}-{:.3} s ({} calls to the ensemble, {} of \
             them waits; {} parked)",
            r.answered.as_secs_f64(),
            r.first_sidecar_had_it.as_secs_f64(),
            r.sidecars_had_it.as_secs_f64(),
            r.calls,
            r.waits,
            r.parked
        )
    };
    row(
        "GetAliveTasks through a sidecar per connection: every answer after the last ask",
        &|m| through(&m.through_sidecars),
    );
    row(
        "Barrier of all, each task's own call: every task passed after the last arrival",
        &|m| format!("{:.3} s", m.barrier.as_secs_f64()),
    );
    // After a round of own GetAliveTasks calls the parked Barrier calls live in the memory that
    // round freed, which the allocator keeps: no growth to read.
    row(
        "... leader memory per parked Barrier call",
        &|m| match m.own_alive {
            Some(_) => "not read (in memory the own GetAliveTasks round freed)".to_string(),
            None => per_call(m, m.leader_rss_before_barrier, m.leader_rss_barrier_parked),
        },
    );
    row(
        "Barrier of all through a sidecar per connection: every task passed after the last arrival",
        &|m| through(&m.barrier_through_sidecars),
    );
    if runs.iter().any(|m| m.watching.is_some()) {
        let watch_round = |r: &super::WatchRound| {
            let compressed = r
                .compressions
                .map_or(String::new(), |n| format!(", {n} compressed"));
            let sidecars = r.every_sidecar_first.map_or(String::new(), |f| {
                format!(" (every sidecar's first task by {:.3} s)", f.as_secs_f64())
            });
            format!(
                "{:.3} s{sidecars}; {:.2} s; {} B an answer{compressed}",
                r.answered.as_secs_f64(),
                r.leader_cpu_seconds,
                r.answer_bytes
            )
        };
        row(
            "every task watching (WatchTasks), each its own call: all answered after a task left; \
             leader CPU; bytes",
            &|m| match &m.watching {
                Some(w) => watch_round(&w.own),
                None => "not run".to_string(),
            },
        );
        row(
            "every task watching through a sidecar per connection: all answered after a task \
             left; leader CPU; bytes",
            &|m| match &m.watching {
                Some(w) => watch_round(&w.through_sidecars),
                None => "not run".to_string(),
            },
        );
    }
    if runs.iter().any(|m| m.leaving.is_some()) {
        row(
            "tasks leaving (ShutdownTask, all at once) while the rest wait in GetAliveTasks: the \
             rest answered after the first left; leader CPU",
            &|m| match &m.leaving {
                Some(l) => format!(
                    "{} left, {} stayed, {} barrier ids before: {:.3} s; {:.2} s",
                    l.leavers,
                    l.stayers,
                    l.history_barriers,
                    l.answered.as_secs_f64(),
                    l.leader_cpu_seconds
                ),
                None => "not run".to_string(),
            },
        );
    }
    row(
        "leader RSS: before, heartbeating, N-1 GetAliveTasks parked, N-1 Barrier parked, after",
        &|m| {
            let alive_parked = own_alive(m, &|_| format!("{:.0}", mib(m.leader_rss_parked)));
            let [a, b, d, e] = [
                m.leader_rss_before,
                m.leader_rss_registered,
                m.leader_rss_barrier_parked,
                m.leader_rss_after,
            ]
            .map(mib);
            format!("{a:.0} -> {b:.0} -> {alive_parked} -> {d:.0} -> {e:.0} MiB")
        },
    );
    row("elections (a leader change fails the size)", &|m| {
        m.elections.to_string()
    });
}

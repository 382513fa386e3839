//! `/metrics`: Prometheus text, read from the Raft node, the proposer, the read index, the log
//! flusher, the links, the parked calls and the applied state when it is scraped.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use coord_raft_store::state::TaskState;

use super::observed::Observed;
use crate::ops::metrics::{counter, counter_f64, gauge, header, single_histogram};

pub(super) async fn render(State(r): State<Arc<Observed>>) -> Response {
    let st = r.status();
    let mut out = String::with_capacity(8 << 10);
    gauge(
        &mut out,
        "coord_raft_term",
        "Current Raft term.",
        st.term as f64,
    );
    gauge(
        &mut out,
        "coord_raft_is_leader",
        "1 if this replica leads.",
        f64::from(u8::from(st.leader_id == Some(st.id))),
    );
    gauge(
        &mut out,
        "coord_has_leader",
        "1 if this replica knows a leader: it leads, or has heard from its leader within the lease.",
        f64::from(u8::from(
            r.leader.current() != crate::raft::leader::Leadership::Unknown,
        )),
    );
    header(
        &mut out,
        "coord_build_info",
        "gauge",
        "The coordinator's version and the commit it was built from; always 1.",
    );
    let _ = writeln!(
        out,
        "coord_build_info{{version=\"{}\",commit=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        env!("COORD_COMMIT")
    );
    gauge(
        &mut out,
        "coord_raft_last_log_index",
        "Last index in this replica's log.",
        st.last_log_index as f64,
    );
    gauge(
        &mut out,
        "coord_raft_last_applied_index",
        "Last index applied to the state machine.",
        st.last_applied as f64,
    );
    gauge(
        &mut out,
        "coord_raft_snapshot_index",
        "Last index covered by the snapshot.",
        st.snapshot_index as f64,
    );
    gauge(
        &mut out,
        "coord_state_bytes",
        "Bytes of the replicated state counted against the memory quota (keys, values, records).",
        st.state_bytes as f64,
    );
    gauge(
        &mut out,
        "coord_quota_bytes",
        "The memory quota on the replicated state (--quota-bytes; 0: none).",
        st.quota_bytes as f64,
    );
    gauge(
        &mut out,
        "coord_quota_alarm",
        "1 while the quota alarm is raised: a write was refused for the quota and usage has not fallen below 95% of it since.",
        f64::from(u8::from(st.quota_alarm)),
    );
    counter_f64(
        &mut out,
        "coord_replica_stalled_seconds_total",
        "Time this replica was stalled (overloaded or stopped: its heartbeat checker woke over 100 ms late), which is not counted as any task's heartbeat silence.",
        r.heartbeats.stalled().as_secs_f64(),
    );
    r.rpcs.render_rpcs(&mut out);
    let compressed = crate::api::shared_answer::compressed();
    counter(
        &mut out,
        "coord_answer_compressions_total",
        "Answers gzip-compressed for callers that accept gzip. An answer every caller of a round shares (a job's devices, a GetAliveTasks round, a large value), on the leader or relayed by a follower, is compressed once for all of them.",
        compressed.answers,
    );
    counter(
        &mut out,
        "coord_answer_compressed_bytes_total",
        "Bytes of the answers counted in coord_answer_compressions_total, before compression.",
        compressed.bytes_in,
    );
    counter(
        &mut out,
        "coord_answer_gzipped_bytes_total",
        "Bytes of the answers counted in coord_answer_compressions_total that were sent compressed (gzip shortened them), after compression: what each of their callers was sent.",
        compressed.bytes_out,
    );
    let (waiting, waits) = crate::api::relayed_waits::relayed_waits();
    gauge(
        &mut out,
        "coord_relayed_waiting_calls",
        "Calls this follower holds, their arrivals recorded on the leader, while the rounds they joined finish (jaxlib's GetAliveTasks, TensorFlow's WaitForAllTasks).",
        waiting as f64,
    );
    counter(
        &mut out,
        "coord_relayed_waits_total",
        "Waits on a round this follower sent the leader for its callers: one a round for all its callers of it.",
        waits,
    );
    let (asks, ask_calls) = crate::api::relayed_asks::ALIVE_ASKS.read();
    counter(
        &mut out,
        "coord_relayed_asks_total",
        "jaxlib GetAliveTasks asks this follower recorded on the leader for its callers, before waiting on their rounds.",
        asks,
    );
    counter(
        &mut out,
        "coord_relayed_ask_calls_total",
        "Calls that recorded them: the asks about a set that come while one such call is on its way go together in the next.",
        ask_calls,
    );
    let (reads, read_calls) = crate::api::relayed_reads::READS.read();
    counter(
        &mut out,
        "coord_relayed_reads_total",
        "Blocking GetKeyValue calls (TensorFlow's and jaxlib's) this follower relayed to the leader for its callers.",
        reads,
    );
    counter(
        &mut out,
        "coord_relayed_read_calls_total",
        "Reads it sent the leader for them: the callers of one read that come while it is on its way are answered by the next.",
        read_calls,
    );

    let p = &r.proposer;
    gauge(
        &mut out,
        "coord_proposal_queue_depth",
        "Client writes waiting for a Raft entry.",
        p.queued.load(Relaxed) as f64,
    );
    gauge(
        &mut out,
        "coord_proposal_in_flight_entries",
        "Raft entries proposed for client writes and not yet answered.",
        p.in_flight.load(Relaxed) as f64,
    );
    gauge(
        &mut out,
        "coord_proposal_stalled_seconds",
        "How long client writes have waited with no entry proposed or answered meanwhile (0 when none wait): a leader that cannot propose.",
        p.stalled_for().as_secs_f64(),
    );
    counter(
        &mut out,
        "coord_proposal_abandoned_leader_lost_total",
        "Entries whose writes were re-driven because this replica stopped leading before Raft answered them.",
        p.abandoned_leader_lost.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_proposal_abandoned_stuck_total",
        "Entries whose writes were re-driven because they were not committed in time on a replica that still led.",
        p.abandoned_stuck.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_proposal_entries_total",
        "Raft entries proposed for client writes.",
        p.entries.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_proposal_commands_total",
        "Client writes proposed (commands_total / entries_total = batching).",
        p.commands.load(Relaxed),
    );
    single_histogram(
        &mut out,
        "coord_commit_latency_seconds",
        "From a write's arrival at the proposer to its applied result.",
        &p.commit_latency,
    );

    single_histogram(
        &mut out,
        "coord_apply_latency_seconds",
        "Applying a batch of committed entries to the state machine (and waking the calls they answer).",
        r.reader.apply_latency(),
    );

    let ri = &r.read_index;
    counter(
        &mut out,
        "coord_read_index_rounds_total",
        "Leadership confirmation rounds for linearizable reads.",
        ri.rounds.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_read_index_reads_total",
        "Linearizable reads served by those rounds.",
        ri.reads.load(Relaxed),
    );
    single_histogram(
        &mut out,
        "coord_read_index_round_seconds",
        "Duration of a read-index round.",
        &ri.round_latency,
    );

    let sy = &r.sync;
    counter(
        &mut out,
        "coord_log_syncs_total",
        "fdatasync calls of the Raft log.",
        sy.syncs.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_log_synced_writes_total",
        "Log writes made durable (synced_writes_total / syncs_total = group commit).",
        sy.jobs.load(Relaxed),
    );
    single_histogram(
        &mut out,
        "coord_log_sync_seconds",
        "Duration of a log sync (fdatasync of the segments written since the last one).",
        &sy.latency,
    );
    counter(
        &mut out,
        "coord_pre_appends_sent_total",
        "Lone writes sent to followers while this replica, leading, synced them.",
        sy.pre_appends_sent.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_pre_appends_written_total",
        "Leader's pre-appends this replica wrote and synced before the leader's AppendEntries.",
        sy.pre_appends_written.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_pre_appends_passed_total",
        "Pre-appends this replica did not take (another leader's, or not extending its log).",
        sy.pre_appends_passed.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_raft_link_calls_total",
        "AppendEntries this replica, leading, had answered over framed links instead of gRPC.",
        r.links.calls.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_raft_link_fallbacks_total",
        "Times a link failed or had a call dropped, after which AppendEntries went over gRPC for 1 s.",
        r.links.fallbacks.load(Relaxed),
    );

    gauge(
        &mut out,
        "coord_parked_calls",
        "Blocking calls parked on this replica.",
        r.hub.parked() as f64,
    );
    gauge(
        &mut out,
        "coord_active_watches",
        "Key watch streams served by this replica.",
        r.hub.watches.active.load(Relaxed) as f64,
    );
    gauge(
        &mut out,
        "coord_parked_slots_used",
        "Parked calls and watch streams counted against --max-parked-calls.",
        r.hub.budget.used() as f64,
    );
    gauge(
        &mut out,
        "coord_parked_slots_max",
        "--max-parked-calls: the bound on parked calls and watches across all clients (0: none).",
        r.hub.budget.max() as f64,
    );
    counter(
        &mut out,
        "coord_parked_refused_total",
        "Blocking calls and watches refused RESOURCE_EXHAUSTED because --max-parked-calls was reached.",
        r.hub.budget.refused(),
    );
    let (tasks, open_barriers) = r.reader.read(|a| match &a.state.cluster {
        Some(c) => (
            [
                TaskState::Disconnected,
                TaskState::Connected,
                TaskState::Error,
            ]
            .map(|st| (st, c.tasks.count_in(st))),
            c.barriers.pending().count(),
        ),
        None => (
            [
                TaskState::Disconnected,
                TaskState::Connected,
                TaskState::Error,
            ]
            .map(|st| (st, 0)),
            0,
        ),
    });
    header(
        &mut out,
        "coord_tasks",
        "gauge",
        "Tasks of the coordinated job by state (this replica's applied state).",
    );
    for (st, n) in tasks {
        let _ = writeln!(out, "coord_tasks{{state=\"{}\"}} {n}", st.name());
    }
    gauge(
        &mut out,
        "coord_open_barriers",
        "Barrier instances waiting for participants.",
        open_barriers as f64,
    );
    r.reader.read(|a| {
        crate::serve::dispatcher::metrics::write(&mut out, &a.state.dispatcher);
    });
    let keys = r.reader.read(|a| a.state.kv.len());
    gauge(
        &mut out,
        "coord_kv_keys",
        "Keys in the key-value store.",
        keys as f64,
    );
    super::ns_metrics::write(&mut out, &r.reader, &r.hub.budget);
    crate::ops::process::render(&mut out);
    let _ = writeln!(out);
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        out,
    )
        .into_response()
}

//! The HTTP port: `/livez`, `/readyz`, `/status` (JSON) and `/metrics` (Prometheus text).
//!
//! Ready means: a leader is known, this replica is a voting member, and it is caught up. A
//! follower asks the leader how far its replication has got (the leader is the only one that
//! knows), so "caught up" is measured against the leader's log, not guessed locally.

use std::fmt::Write;
use std::future::Future;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Json;
use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::StatusRequest;
use tokio::net::TcpListener;

use crate::metrics::{counter, gauge, header, single_histogram};
use crate::peers::PeerChannels;
use crate::replica::Replica;
use coord_raft_store::state::TaskState;

struct HttpState {
    replica: Arc<Replica>,
    peers: PeerChannels,
}

pub async fn serve(
    listener: TcpListener,
    replica: Arc<Replica>,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    let state = Arc::new(HttpState {
        replica: replica.clone(),
        peers: replica.peer_channels(),
    });
    let app = axum::Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/", get(page))
        .route("/api/overview", get(overview))
        .with_state(state);
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
    {
        tracing::warn!(error = %e, "HTTP server ended with an error");
    }
}

/// The status page: a person leaves it open during a training run; it refreshes itself from
/// `/api/overview`.
async fn page() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("status_page.html"),
    )
        .into_response()
}

#[derive(serde::Serialize)]
struct Overview {
    me: u64,
    leader: Option<u64>,
    replicas: Vec<ReplicaRow>,
    tasks: Vec<TaskCell>,
    barriers: Vec<BarrierLine>,
    /// Why tasks or barriers could not be read (no leader, ...), for the page's banner.
    problem: Option<String>,
}

#[derive(serde::Serialize)]
struct ReplicaRow {
    id: u64,
    addr: String,
    reachable: bool,
    /// The leader of the highest term any replica reports (a deposed leader that has not heard
    /// of its successor still says "Leader", of an older term).
    leader: bool,
    state: Option<String>,
    term: Option<u64>,
    last_log_index: Option<u64>,
    last_applied: Option<u64>,
    lag: Option<u64>,
}

#[derive(serde::Serialize)]
struct TaskCell {
    name: String,
    job: String,
    task: u32,
    state: String,
    heartbeat_age_ms: Option<u64>,
    error: Option<String>,
}

#[derive(serde::Serialize)]
struct BarrierLine {
    id: String,
    counter: i64,
    arrived: Vec<String>,
    missing: Vec<String>,
    ms_left: Option<i64>,
}

/// Asks replica `addr` for its status, with a one-second limit; the error says why not.
async fn status_of(
    peers: &PeerChannels,
    addr: &str,
) -> Result<coord_proto::coord::admin::StatusReply, String> {
    let channel = peers.get(addr)?;
    let mut req = tonic::Request::new(StatusRequest {});
    req.set_timeout(Duration::from_secs(1));
    tokio::time::timeout(
        Duration::from_secs(1),
        AdminClient::new(channel).status(req),
    )
    .await
    .map_err(|_| format!("{addr} did not answer in time"))?
    .map(tonic::Response::into_inner)
    .map_err(|e| format!("{addr}: {}", e.message()))
}

/// Everything the status page shows: every replica's own view, and the tasks and open barriers
/// as the leader has them (asked through this replica's own gRPC port, which routes there).
async fn overview(State(s): State<Arc<HttpState>>) -> Json<Overview> {
    let me = s.replica.status();
    let mut views = Vec::new();
    for m in &me.members {
        let view = if m.id == me.id {
            Some(me.to_proto())
        } else {
            status_of(&s.peers, &m.addr).await.ok()
        };
        views.push((m, view));
    }
    let leader_view = views
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .filter(|v| v.state == "Leader")
        .max_by_key(|v| v.term);
    let (leader_id, leader_log) = (
        leader_view.map(|v| v.id),
        leader_view.map(|v| v.last_log_index),
    );
    let replicas = views
        .into_iter()
        .map(|(m, v)| ReplicaRow {
            id: m.id,
            addr: m.addr.clone(),
            reachable: v.is_some(),
            leader: Some(m.id) == leader_id,
            lag: v
                .as_ref()
                .zip(leader_log)
                .map(|(v, l)| l.saturating_sub(v.last_applied)),
            state: v.as_ref().map(|v| {
                if v.state == "Leader" && Some(m.id) != leader_id {
                    format!("Leader (deposed, term {})", v.term)
                } else {
                    v.state.clone()
                }
            }),
            term: v.as_ref().map(|v| v.term),
            last_log_index: v.as_ref().map(|v| v.last_log_index),
            last_applied: v.as_ref().map(|v| v.last_applied),
        })
        .collect();

    let mut problem = None;
    let mut tasks = Vec::new();
    let mut barriers = Vec::new();
    let own = loopback(s.replica.args.listen);
    match s.peers.get(&own) {
        Ok(ch) => {
            let mut client = AdminClient::new(ch);
            let mut req = tonic::Request::new(coord_proto::coord::admin::TasksRequest {});
            req.set_timeout(Duration::from_secs(2));
            match client.tasks(req).await {
                Ok(r) => {
                    tasks = r
                        .into_inner()
                        .tasks
                        .into_iter()
                        .map(|t| TaskCell {
                            name: format!("/job:{}/task:{}", t.job, t.task),
                            job: t.job,
                            task: t.task,
                            state: t.state,
                            heartbeat_age_ms: t.heartbeat_age_ms,
                            error: (!t.error_message.is_empty()).then_some(t.error_message),
                        })
                        .collect()
                }
                Err(e) => problem = Some(format!("tasks: {}", e.message())),
            }
            let mut req = tonic::Request::new(coord_proto::coord::admin::BarriersRequest {});
            req.set_timeout(Duration::from_secs(2));
            match client.barriers(req).await {
                Ok(r) => {
                    barriers = r
                        .into_inner()
                        .barriers
                        .into_iter()
                        .map(|b| BarrierLine {
                            id: b.id,
                            counter: b.counter,
                            arrived: b.arrived,
                            missing: b.missing,
                            ms_left: b.ms_left,
                        })
                        .collect()
                }
                Err(e) => problem = Some(format!("barriers: {}", e.message())),
            }
        }
        Err(e) => problem = Some(e),
    }
    Json(Overview {
        me: me.id,
        leader: leader_id.or(me.leader_id),
        replicas,
        tasks,
        barriers,
        problem,
    })
}

/// Where this process can reach its own gRPC port (`0.0.0.0` is not an address to dial).
fn loopback(listen: std::net::SocketAddr) -> String {
    if listen.ip().is_unspecified() {
        format!("127.0.0.1:{}", listen.port())
    } else {
        listen.to_string()
    }
}

async fn livez(State(s): State<Arc<HttpState>>) -> Response {
    match &s.replica.raft.metrics().borrow().running_state {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Raft stopped: {e}\n"),
        )
            .into_response(),
    }
}

async fn status(State(s): State<Arc<HttpState>>) -> Json<crate::status::ReplicaStatus> {
    Json(s.replica.status())
}

async fn readyz(State(s): State<Arc<HttpState>>) -> Response {
    match readiness(&s).await {
        Ok(msg) => (StatusCode::OK, format!("{msg}\n")).into_response(),
        Err(msg) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {msg}\n"),
        )
            .into_response(),
    }
}

async fn readiness(s: &HttpState) -> Result<String, String> {
    let me = s.replica.status();
    let leader = me.leader_id.ok_or("no leader is known")?;
    if !me.members.iter().any(|m| m.id == me.id && m.voter) {
        return Err(format!("replica {} is not a voting member", me.id));
    }
    if leader == me.id {
        let lease = s.replica.args.election_timeout_max_ms;
        return match me.millis_since_quorum_ack {
            Some(ms) if ms <= lease => {
                Ok(format!("ready: replica {} leads term {}", me.id, me.term))
            }
            Some(ms) => Err(format!(
                "leader without a quorum acknowledgement for {ms} ms"
            )),
            None => Err("leader not yet acknowledged by a quorum".into()),
        };
    }
    let addr = me
        .members
        .iter()
        .find(|m| m.id == leader)
        .map(|m| m.addr.clone())
        .ok_or_else(|| format!("leader {leader} is not in the membership"))?;
    let leader_view = status_of(&s.peers, &addr)
        .await
        .map_err(|e| format!("leader {leader} at {e}"))?;
    let matched = leader_view
        .members
        .iter()
        .find(|m| m.id == me.id)
        .and_then(|m| m.matched_index)
        .ok_or_else(|| format!("leader {leader} does not replicate to replica {}", me.id))?;
    let max_lag = s.replica.args.ready_max_lag;
    let lag = leader_view.last_log_index.saturating_sub(matched);
    let apply_lag = matched.saturating_sub(me.last_applied);
    if lag > max_lag || apply_lag > max_lag {
        return Err(format!(
            "{lag} entries behind leader {leader} and {apply_lag} entries not yet applied (limit {max_lag})"
        ));
    }
    Ok(format!(
        "ready: following leader {leader}, {lag} entries behind"
    ))
}

async fn metrics(State(s): State<Arc<HttpState>>) -> Response {
    let r = &s.replica;
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
    r.metrics.render_rpcs(&mut out);

    let p = r.kv.proposer.stats();
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
        r.kv.reader.apply_latency(),
    );

    let ri = r.kv.read_index.stats();
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

    let sy = &r.sync_stats;
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
        "AppendEntries this replica, leading, had answered over plain links instead of gRPC.",
        r.link_stats.calls.load(Relaxed),
    );
    counter(
        &mut out,
        "coord_raft_link_fallbacks_total",
        "Times a link failed or had a call dropped, after which AppendEntries went over gRPC for 1 s.",
        r.link_stats.fallbacks.load(Relaxed),
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
    let (tasks, open_barriers) = r.kv.reader.read(|a| match &a.state.cluster {
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
        let _ = writeln!(
            out,
            "coord_tasks{{state=\"{}\"}} {n}",
            crate::status::task_state_name(st)
        );
    }
    gauge(
        &mut out,
        "coord_open_barriers",
        "Barrier instances waiting for participants.",
        open_barriers as f64,
    );
    r.kv.reader
        .read(|a| crate::dispatcher::metrics::write(&mut out, &a.state.dispatcher));
    let keys = r.kv.reader.read(|a| a.state.kv.len());
    gauge(
        &mut out,
        "coord_kv_keys",
        "Keys in the key-value store.",
        keys as f64,
    );
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

//! The status page: a person leaves it open during a training run; it refreshes itself from
//! `/api/overview`, which shows every replica's own view, every namespace with its usage, and the
//! tasks and open barriers of one namespace (`?namespace=NAME`; the default one without) as the
//! leader has them.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use coord_proto::coord::admin::admin_client::AdminClient;
use coord_proto::coord::admin::namespaces_client::NamespacesClient;
use coord_proto::coord::admin::ListNamespacesRequest;

use super::observed::{status_of, Observed};

/// The page itself.
pub(super) async fn page() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        include_str!("status_page.html"),
    )
        .into_response()
}

#[derive(serde::Serialize)]
pub(super) struct Overview {
    me: u64,
    leader: Option<u64>,
    replicas: Vec<ReplicaRow>,
    /// The namespace whose tasks and barriers are shown (`None`: the default one).
    namespace: Option<String>,
    namespaces: Vec<NamespaceLine>,
    tasks: Vec<TaskCell>,
    barriers: Vec<BarrierLine>,
    /// Why tasks or barriers could not be read (no leader, ...), for the page's banner.
    problem: Option<String>,
    /// The memory quota's alarm, as the replicas report it, for the page's banner.
    quota_alarm: Option<String>,
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
    state_bytes: Option<u64>,
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
struct NamespaceLine {
    name: String,
    tasks: u64,
    connected: u64,
    keys: u64,
    bytes: u64,
    parked: u64,
}

#[derive(serde::Serialize)]
struct BarrierLine {
    id: String,
    counter: i64,
    arrived: Vec<String>,
    missing: Vec<String>,
    ms_left: Option<i64>,
}

/// Everything the status page shows: every replica's own view, and the tasks and open barriers
/// as the leader has them (asked through this replica's own gRPC port, which routes there).
pub(super) async fn overview(
    State(s): State<Arc<Observed>>,
    uri: axum::http::Uri,
) -> Json<Overview> {
    // Namespace names need no decoding: letters, digits, '-', '_' and '.'.
    let namespace = uri
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("namespace=")))
        .filter(|n| !n.is_empty() && *n != "default")
        .map(str::to_string);
    let in_namespace = |req: &mut tonic::metadata::MetadataMap| {
        if let Some(v) = namespace.as_deref().and_then(|n| n.parse().ok()) {
            req.insert(coord_proto::metadata::NAMESPACE, v);
        }
    };
    let me = s.status();
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
    let quota_alarm = views
        .iter()
        .filter_map(|(_, v)| v.as_ref())
        .find(|v| v.quota_alarm)
        .map(|v| {
            format!(
                "memory quota alarm: the replicated state holds {} of its {}-byte quota (--quota-bytes); writes that grow it are refused until deletes bring it below 95%",
                v.state_bytes, v.quota_bytes
            )
        });
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
            state_bytes: v.as_ref().map(|v| v.state_bytes),
        })
        .collect();

    let mut problem = None;
    let mut tasks = Vec::new();
    let mut barriers = Vec::new();
    let mut namespaces = Vec::new();
    let own = loopback(s.listen);
    match s.peers.get(&own) {
        Ok(ch) => {
            let mut ns_client = NamespacesClient::new(ch.clone());
            let mut req = tonic::Request::new(ListNamespacesRequest {});
            req.set_timeout(Duration::from_secs(2));
            match ns_client.list(req).await {
                Ok(r) => {
                    namespaces = r
                        .into_inner()
                        .namespaces
                        .into_iter()
                        .map(|n| NamespaceLine {
                            name: n.name,
                            tasks: n.tasks,
                            connected: n.connected_tasks,
                            keys: n.keys,
                            bytes: n.bytes,
                            parked: n.parked,
                        })
                        .collect()
                }
                Err(e) => problem = Some(format!("namespaces: {}", e.message())),
            }
            let mut client = AdminClient::new(ch);
            let mut req = tonic::Request::new(coord_proto::coord::admin::TasksRequest {});
            req.set_timeout(Duration::from_secs(2));
            in_namespace(req.metadata_mut());
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
            in_namespace(req.metadata_mut());
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
        namespace,
        namespaces,
        tasks,
        barriers,
        problem,
        quota_alarm,
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

//! `coord.kv.KeyValue`: atomic increment (routed like any write) and key watches (served by the
//! leader from the [`WatchHub`](crate::serve::watch_hub::WatchHub)).

use std::pin::Pin;
use std::sync::Arc;

use coord_proto::coord::kv as pb;
use coord_proto::coord::kv::key_value_client::KeyValueClient;
use coord_proto::coord::kv::key_value_server::KeyValue;
use futures::Stream;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::error::CoordError;
use crate::raft::leader::{LeaderWatch, Leadership};
use crate::serve::apply_hub::ApplyHub;
use crate::serve::kv::KvCore;
use crate::serve::parked::Slot;
use crate::serve::route::{Kind, Router};
use crate::serve::watch_hub::{EventKind, KvEvent, WatchHub};

pub struct KvService {
    router: Arc<Router>,
    kv: Arc<KvCore>,
    /// Where each namespace's key changes are recorded for watches.
    hub: Arc<ApplyHub>,
    leader: LeaderWatch,
    me: u64,
}

impl KvService {
    pub fn new(
        router: Arc<Router>,
        kv: Arc<KvCore>,
        hub: Arc<ApplyHub>,
        leader: LeaderWatch,
        me: u64,
    ) -> Self {
        Self {
            router,
            kv,
            hub,
            leader,
            me,
        }
    }
}

fn to_wire(e: &KvEvent) -> pb::WatchEvent {
    pb::WatchEvent {
        kind: match e.kind {
            EventKind::Put => pb::watch_event::Kind::Put as i32,
            EventKind::Delete => pb::watch_event::Kind::Delete as i32,
        },
        key: e.key.clone(),
        value: e.value.clone(),
        revision: e.revision,
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchResponse, Status>> + Send>>;

/// Counts a watch stream as active while it lives; it holds a slot of the park budget.
struct ActiveWatch {
    hub: Arc<WatchHub>,
    _slot: Slot,
}

impl ActiveWatch {
    fn new(hub: Arc<WatchHub>, slot: Slot) -> Self {
        hub.active
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Self { hub, _slot: slot }
    }
}

impl Drop for ActiveWatch {
    fn drop(&mut self) {
        self.hub
            .active
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tonic::async_trait]
impl KeyValue for KvService {
    async fn increment(
        &self,
        req: Request<pb::IncrementRequest>,
    ) -> Result<Response<pb::IncrementResponse>, Status> {
        let kv = &*self.kv;
        self.router
            .route(
                "Increment",
                Kind::Write,
                req,
                |m, id| async move {
                    let value = kv.increment(id, &m.key, m.delta).await?;
                    Ok(pb::IncrementResponse { value })
                },
                |ch, r| async move { KeyValueClient::new(ch).increment(r).await },
            )
            .await
    }

    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<pb::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        // Not routed (a watch is served where it is opened): bound to its namespace here.
        let ns = self.router.namespace_of(&req)?;
        let exists = self
            .kv
            .reader
            .all()
            .read(|a| crate::serve::namespace::exists(a, &ns));
        if !exists {
            return Err(
                CoordError::from(coord_raft_store::state::namespace_not_found(
                    crate::serve::namespace::shown(&ns),
                ))
                .into(),
            );
        }
        crate::serve::namespace::within(ns.clone(), self.watch_in(ns, req.into_inner())).await
    }
}

impl KvService {
    /// Serves a watch of namespace `ns` (the call is bound to it).
    async fn watch_in(
        &self,
        ns: crate::serve::namespace::Ns,
        req: pb::WatchRequest,
    ) -> Result<Response<WatchStream>, Status> {
        let watches = self.hub.watches_of(&ns);
        if self.leader.current() != Leadership::Me {
            // Watches are leader memory: send the client to the leader.
            return Err(CoordError::NotLeader {
                me: self.me,
                leader: self.leader.current().hint(),
            }
            .into());
        }
        let key = self.kv.check_key(&req.key, "watched key")?;
        let budget = self.kv.parked.budget();
        let slot = budget
            .take()
            .ok_or_else(|| budget.refusal(&format!("Watch of key {key:?}")))?;
        // Subscribe before reading history, so no change falls between the two.
        let mut live = watches.subscribe();
        let start = if req.start_revision == 0 {
            self.kv.read_index.linearize().await?;
            self.kv.reader.read(|a| a.state.kv.revision()) + 1
        } else {
            req.start_revision
        };
        let backlog = watches.since(start, &key).map_err(|c| {
            Status::out_of_range(format!(
                "watch of {key:?} from revision {start}: this leader keeps changes from revision {} on; read the current values and watch from there",
                c.oldest
            ))
        })?;
        let (tx, rx) = mpsc::channel(64);
        let leader = self.leader.clone();
        let active = ActiveWatch::new(watches.clone(), slot);
        tokio::spawn(async move {
            let _active = active;
            let mut last = start - 1;
            let first = pb::WatchResponse {
                started_after: last,
                events: backlog.iter().map(to_wire).collect(),
            };
            if let Some(e) = backlog.last() {
                last = e.revision;
            }
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            loop {
                let batch = tokio::select! {
                    b = live.recv() => b,
                    () = leader.lost() => {
                        let _ = tx.send(Err(Status::unavailable("the leader serving this watch lost its leadership; resume on the new leader"))).await;
                        return;
                    }
                };
                let batch = match batch {
                    Ok(b) => b,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx
                            .send(Err(Status::unavailable(format!(
                                "watch of {key:?} fell behind the change feed; resume from revision {}",
                                last + 1
                            ))))
                            .await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let events: Vec<pb::WatchEvent> = batch
                    .iter()
                    .filter(|e| e.revision > last && e.concerns(&key))
                    .map(to_wire)
                    .collect();
                let Some(newest) = events.last().map(|e| e.revision) else {
                    continue;
                };
                last = newest;
                let msg = pb::WatchResponse {
                    started_after: 0,
                    events,
                };
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

//! The coord ensemble as a benchmark target, driven through coord's own client (request ids,
//! failover and all), and as an [`Ensemble`] whose leader can be killed.

use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};

use super::{Ensemble, KvTarget};
use crate::cluster::Cluster;

pub struct CoordTarget {
    clients: Vec<CoordClient>,
}

impl CoordTarget {
    /// `connections` clients, each with its own connections, all pointed at the leader.
    pub async fn connect(endpoints: Vec<String>, connections: usize) -> Result<Self, String> {
        Self::connect_with(endpoints, connections, None).await
    }

    /// [`Self::connect`] over TLS when `tls` is given.
    pub async fn connect_with(
        endpoints: Vec<String>,
        connections: usize,
        tls: Option<coord_proto::tls::ClientTls>,
    ) -> Result<Self, String> {
        let mut clients = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let mut options = ClientOptions::new(endpoints.clone());
            options.tls = tls.clone();
            let c = CoordClient::new(options).map_err(|e| e.to_string())?;
            c.find_leader().await.ok_or("no coord leader found")?;
            clients.push(c);
        }
        Ok(Self { clients })
    }
}

impl KvTarget for CoordTarget {
    async fn put(&self, conn: usize, key: String, value: Bytes) -> Result<(), String> {
        self.clients[conn]
            .insert(&key, value, true)
            .await
            .map_err(|e| e.to_string())
    }

    async fn get(&self, conn: usize, key: String) -> Result<(), String> {
        self.clients[conn]
            .try_get(&key)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn connections(&self) -> usize {
        self.clients.len()
    }
}

/// A coord [`Cluster`] as something whose leader the failover benchmark kills.
pub struct CoordEnsemble<'a> {
    pub cluster: &'a mut Cluster,
    killed: Option<u64>,
}

impl<'a> CoordEnsemble<'a> {
    pub fn new(cluster: &'a mut Cluster) -> Self {
        Self {
            cluster,
            killed: None,
        }
    }
}

impl Ensemble for CoordEnsemble<'_> {
    async fn kill_leader(&mut self) -> String {
        let leader = self.cluster.wait_for_leader(Duration::from_secs(30)).await;
        self.cluster.kill(leader);
        self.killed = Some(leader);
        format!("replica {leader}")
    }

    async fn recover(&mut self) {
        let Some(id) = self.killed.take() else { return };
        self.cluster.spawn(id);
        let leader = self.cluster.wait_for_leader(Duration::from_secs(60)).await;
        let target = self.cluster.status(leader).map_or(0, |s| s.last_log_index);
        self.cluster
            .wait_applied(id, target, Duration::from_secs(60))
            .await;
    }
}

/// A Raft log engine of the coordinator (`--raft-log`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaftLog {
    Segments,
    Sled,
}

impl RaftLog {
    /// Both engines, the default first.
    pub const ALL: [RaftLog; 2] = [RaftLog::Segments, RaftLog::Sled];

    pub fn name(self) -> &'static str {
        match self {
            RaftLog::Segments => "segments",
            RaftLog::Sled => "sled",
        }
    }

    /// The coordinator flags that select it.
    pub fn args(self) -> [String; 2] {
        ["--raft-log".into(), self.name().into()]
    }
}

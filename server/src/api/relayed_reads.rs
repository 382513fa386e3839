//! A follower's callers of one key-value read, answered by one read on the leader.
//!
//! Every process of a JAX job reads the job's global topology (one value of every task's
//! devices, 1.7 MB at 10,000 tasks) with a blocking GetKeyValue, and after a failover jaxlib's
//! and TensorFlow's clients keep calling the replica they were given, now a follower. Relayed
//! call by call, each read brought the follower its own uncompressed copy of the value from the
//! leader: 10,000 copies of 1.7 MB for one read of the job, 1.4–1.6× TensorFlow's own service's
//! time where the same read through the leader takes 0.04× it. Instead a read that comes while
//! the same read (the same request, in the same namespace) is on its way waits for it and is
//! answered by the next, with every other caller that came meanwhile ([`Batches`]): that read
//! starts after each of them came, so what it answers is what each of them could have read on
//! its own (linearizable), and the leader sends a few copies of the value, not one per caller.

use std::future::Future;
use std::hash::Hash;

use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::api::relayed_asks::{Batches, Sent};
use crate::api::relayed_waits::with_metadata;
use crate::raft::peers::PeerChannel;
use crate::serve::namespace::{self, Ns};

/// Blocking key-value reads this replica relayed to the leader for its callers, and the reads
/// it sent for them: `coord_relayed_reads_total` and `coord_relayed_read_calls_total`.
pub static READS: Sent = Sent::new();

/// The reads of `Req` a follower's callers wait on, by namespace and request.
pub struct RelayedReads<Req, Resp> {
    batches: Batches<(Ns, Req), (PeerChannel, MetadataMap), Resp>,
}

impl<Req, Resp> Default for RelayedReads<Req, Resp> {
    fn default() -> Self {
        Self {
            batches: Batches::default(),
        }
    }
}

impl<Req, Resp> RelayedReads<Req, Resp>
where
    Req: Hash + Eq + Clone + Send + Sync + 'static,
    Resp: Clone + Send + 'static,
{
    /// The answer to `req`, a read forwarded to the leader on `ch`: from the next `read` (the
    /// method's call on the leader) to start after it came, shared with the other callers of
    /// that read. The read goes on the newest caller's channel under its metadata (the leader
    /// its routing saw last).
    pub async fn answer<R, F>(
        &self,
        ch: PeerChannel,
        req: Request<Req>,
        read: R,
    ) -> Result<Response<Resp>, Status>
    where
        R: Fn(PeerChannel, Request<Req>) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Response<Resp>, Status>> + Send + 'static,
    {
        let (metadata, _, m) = req.into_parts();
        let key = (namespace::current(), m.clone());
        let answer = self
            .batches
            .answer(key, (ch, metadata), move |mut callers| {
                let n = callers.len();
                READS.call(n);
                let newest = callers.pop();
                let read =
                    newest.map(|(ch, metadata)| read(ch, with_metadata(&metadata, m.clone())));
                async move {
                    let Some(read) = read else {
                        return Ok(Vec::new());
                    };
                    let answer = read.await?.into_inner();
                    Ok(vec![answer; n])
                }
            });
        answer.await.map(Response::new)
    }
}

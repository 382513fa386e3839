//! WaitForAllTasks through a follower: each call's arrival recorded on the leader at once, and
//! one call on the leader per gathering for all the follower's callers of it.
//!
//! Every task of a job gets the whole job's devices: relayed call by call, each call parked on
//! the leader and came back with its own copy, so a 10,000-task job gathering through a follower
//! sent the follower's link 10,000 copies of some 1.7 MB of devices. Instead the follower records
//! the call's arrival as a sidecar records its tasks' (`coordination/WaitForAllTasksArrivals`),
//! and the callers of the gathering share one task's own call, sent again (its arrival is
//! recorded once), whose answer each of them is sent from the one buffer it came in (see
//! `api::relayed_waits`). Callers are shared by the form they read the devices in, which decides
//! the answer's fields.
//!
//! A leader that does not know `WaitForAllTasksArrivals` answers UNIMPLEMENTED; the call is then
//! relayed as it came.

use bytes::Bytes;
use coord_proto::codec::call_undecoded;
use coord_proto::coord::coordination::WaitForAllTasksArrivalsRequest;
use coord_proto::tensorflow as tf;
use futures::FutureExt;
use tonic::{Request, Response, Status};

use super::{AnswerForm, TfService};
use crate::api::relayed_waits::{recorded, unknown_to_the_leader, with_metadata};
use crate::raft::peers::{PeerChannel, PEER_MESSAGE_LIMIT};
use crate::serve::namespace;

const WAIT_FOR_ALL_TASKS: &str = "/tensorflow.CoordinationService/WaitForAllTasks";

impl TfService {
    /// A follower's WaitForAllTasks call, forwarded as `req` to the leader (channel `ch`): its
    /// arrival recorded there, then the job's devices as the leader encoded them, fetched once
    /// for every caller of the gathering.
    pub(super) async fn relay_wait_for_all(
        &self,
        ch: PeerChannel,
        req: Request<tf::WaitForAllTasksRequest>,
    ) -> Result<Response<tf::WaitForAllTasksResponse>, Status> {
        let (metadata, _, m) = req.into_parts();
        let form = AnswerForm::of(&m);
        let arrivals = WaitForAllTasksArrivalsRequest {
            arrivals: vec![m.clone()],
        };
        let arrived = crate::api::coordination::client(ch.clone())
            .wait_for_all_tasks_arrivals(with_metadata(&metadata, arrivals))
            .await;
        let own = with_metadata(&metadata, m);
        let instance = match arrived {
            Ok(r) => recorded(r.into_inner().answers)?.counter,
            Err(s) if unknown_to_the_leader(&s) => return own_call(ch, own).await.map(devices),
            Err(s) => return Err(s),
        };
        let key = (namespace::current(), form, instance);
        let encoded = self
            .gatherings
            .answer(key, || {
                own_call(ch, own)
                    .map(|r| r.map(Response::into_inner))
                    .boxed()
            })
            .await?;
        Ok(devices(Response::new(encoded)))
    }
}

/// The task's own call on the leader, its answer's bytes kept undecoded.
async fn own_call(
    ch: PeerChannel,
    req: Request<tf::WaitForAllTasksRequest>,
) -> Result<Response<Bytes>, Status> {
    call_undecoded(ch, req, WAIT_FOR_ALL_TASKS, PEER_MESSAGE_LIMIT, false).await
}

/// The leader's answer as its bytes: the whole answer as `encoded`, which `shared_answer` sends
/// from the buffer it shares with the gathering's other callers.
fn devices(answer: Response<Bytes>) -> Response<tf::WaitForAllTasksResponse> {
    answer.map(|encoded| tf::WaitForAllTasksResponse {
        encoded,
        ..Default::default()
    })
}

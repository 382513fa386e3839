//! jaxlib's GetAliveTasks from the tasks a sidecar carries: their asks recorded together, and one
//! wait per round of the set for all of them (see [`super::arrivals`]).
//!
//! GetAliveTasks is a barrier over the live tasks of a set: jax's `live_devices` has every task
//! of the job ask about the whole job, and each call parks on the leader until the last live task
//! asked. A sidecar instead records its tasks' asks without parking them
//! (`coordination/XlaAliveArrivals`, each under a request number of its own, as each task's own
//! call is recorded once however often it is sent) and waits on each round its tasks joined with
//! one call (`coordination/AwaitAlive`), whose answer each of them gets: the answer of the round,
//! as its own call would have had it, and the one buffer it came in (undecoded, as
//! WaitForAllTasks' devices are).

use coord_proto::coord::coordination::{AwaitAliveRequest, BarrierAnswer};
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient as XlaServiceClient;
use tonic::Status;

use super::arrivals::{Boxed, Gathered, Gatherer};
use super::barriers::{fetch_undecoded, own_error};
use crate::client::CoordClient;

/// jaxlib's GetAliveTasks calls, recorded together.
pub struct XlaAlive;

/// GetAliveTasks asks a proxy records together.
pub type XlaAliveBatches = Gatherer<XlaAlive>;

/// The tasks a set names, sorted and each once: the same set however a task ordered it.
fn set_of(task_ids: &[i32]) -> Vec<i32> {
    let mut ids = task_ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids
}

impl Gathered for XlaAlive {
    type Req = xla::GetAliveTasksRequest;
    type Answer = xla::GetAliveTasksResponse;
    /// The set asked about (as [`set_of`] writes it) and the round of it.
    type Key = (Vec<i32>, i64);

    fn record(
        client: CoordClient,
        arrivals: Vec<xla::GetAliveTasksRequest>,
    ) -> Boxed<Result<Vec<BarrierAnswer>, Status>> {
        Box::pin(async move { client.xla_alive_arrivals(arrivals).await })
    }

    /// An error is the task's own; otherwise the round it joined answers it, finished or not.
    fn decided(
        arrival: &xla::GetAliveTasksRequest,
        answer: BarrierAnswer,
    ) -> Result<Result<xla::GetAliveTasksResponse, Status>, (Vec<i32>, i64)> {
        if answer.error_code == 0 {
            return Err((set_of(&arrival.task_ids), answer.counter));
        }
        Ok(Err(own_error(answer)))
    }

    /// The round's answer, its bytes kept as they came: every task gets the one buffer.
    fn wait(
        client: CoordClient,
        (task_ids, generation): (Vec<i32>, i64),
        _: xla::GetAliveTasksRequest,
    ) -> Boxed<Result<xla::GetAliveTasksResponse, Status>> {
        Box::pin(async move {
            let req = AwaitAliveRequest {
                task_ids,
                generation,
            };
            let encoded = client
                .forward(req, false, true, |ch, r| {
                    fetch_undecoded(ch, r, "/coord.coordination.Coordination/AwaitAlive")
                })
                .await?;
            Ok(xla::GetAliveTasksResponse {
                encoded,
                ..Default::default()
            })
        })
    }

    fn alone(
        client: CoordClient,
        arrival: xla::GetAliveTasksRequest,
    ) -> Boxed<Result<xla::GetAliveTasksResponse, Status>> {
        Box::pin(async move {
            client
                .forward(arrival, true, true, |ch, r| async move {
                    XlaServiceClient::new(ch)
                        .max_decoding_message_size(super::MESSAGE_LIMIT)
                        .get_alive_tasks(r)
                        .await
                })
                .await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_is_the_same_however_a_task_orders_it() {
        assert_eq!(set_of(&[2, 0, 1, 2]), vec![0, 1, 2]);
        assert_eq!(set_of(&[]), Vec::<i32>::new());
    }
}

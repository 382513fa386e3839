//! The kinds of call whose arrivals coord-proxy records together (see [`super::arrivals`]):
//! TensorFlow's and jaxlib's Barrier, waited on per instance with `AwaitBarrier`; and TensorFlow's
//! WaitForAllTasks, the service's own barrier, whose answer (the whole job's devices) is fetched
//! once per form of answer with one task's own call and handed, as the bytes that came, to every
//! task that asked in that form.

use coord_proto::coord::coordination::coordination_client::CoordinationClient;
use coord_proto::coord::coordination::{
    AwaitBarrierRequest, BarrierAnswer, BarrierArrivalsRequest, WaitForAllTasksArrivalsRequest,
    XlaBarrierArrivalsRequest,
};
use coord_proto::metadata::final_status;
use coord_proto::tensorflow as tf;
use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient as XlaServiceClient;
use tonic::Status;

use super::arrivals::{own_size, Boxed, Gathered, Gatherer, Size};
use crate::client::CoordClient;

/// TensorFlow Barrier calls, recorded together (`coordination/BarrierArrivals`).
pub struct Barriers;

/// Barrier arrivals a proxy records together.
pub type BarrierBatches = Gatherer<Barriers>;

/// A decided arrival's answer as its own call's: the counter, or the service's error.
fn answered(a: BarrierAnswer) -> Result<i64, Status> {
    if a.error_code == 0 {
        return Ok(a.counter);
    }
    Err(own_error(a))
}

/// The error an arrival's answer carries, as its own call would have ended with it.
pub(super) fn own_error(a: BarrierAnswer) -> Status {
    final_status(a.error_code, a.error_message, a.error_details)
}

/// A barrier arrival's counter if its instance is decided (or its error), else the instance it
/// is pending at.
fn decided_counter(
    barrier_id: &str,
    answer: BarrierAnswer,
) -> Result<Result<i64, Status>, (String, i64)> {
    if answer.pending {
        return Err((barrier_id.to_string(), answer.counter));
    }
    Ok(answered(answer))
}

/// Waits on a barrier instance (`AwaitBarrier`): the counter or error every task pending there
/// is answered with. TensorFlow's and jaxlib's barriers are the same barriers on the ensemble.
async fn await_instance(
    client: CoordClient,
    (barrier_id, counter): (String, i64),
) -> Result<i64, Status> {
    let req = AwaitBarrierRequest {
        barrier_id,
        counter,
    };
    let answer = client
        .forward(req, false, true, |ch, r| async move {
            CoordinationClient::new(ch).await_barrier(r).await
        })
        .await?;
    answered(answer)
}

impl Gathered for Barriers {
    type Req = tf::BarrierRequest;
    type Answer = tf::BarrierResponse;
    /// The instance: barrier id and counter.
    type Key = (String, i64);

    fn size(arrival: &tf::BarrierRequest) -> Size {
        own_size(arrival)
    }

    fn record(
        client: CoordClient,
        arrivals: Vec<tf::BarrierRequest>,
    ) -> Boxed<Result<Vec<BarrierAnswer>, Status>> {
        Box::pin(async move {
            let req = BarrierArrivalsRequest { arrivals };
            let resp = client
                .forward(req, true, false, |ch, r| async move {
                    CoordinationClient::new(ch).barrier_arrivals(r).await
                })
                .await?;
            Ok(resp.answers)
        })
    }

    fn decided(
        arrival: &tf::BarrierRequest,
        answer: BarrierAnswer,
    ) -> Result<Result<tf::BarrierResponse, Status>, (String, i64)> {
        decided_counter(&arrival.barrier_id, answer)
            .map(|decided| decided.map(|counter| tf::BarrierResponse { counter }))
    }

    fn wait(
        client: CoordClient,
        instance: (String, i64),
        _: tf::BarrierRequest,
    ) -> Boxed<Result<tf::BarrierResponse, Status>> {
        Box::pin(async move {
            let counter = await_instance(client, instance).await?;
            Ok(tf::BarrierResponse { counter })
        })
    }

    fn alone(
        client: CoordClient,
        arrival: tf::BarrierRequest,
    ) -> Boxed<Result<tf::BarrierResponse, Status>> {
        Box::pin(async move {
            client
                .forward(arrival, true, true, |ch, r| async move {
                    CoordinationServiceClient::new(ch).barrier(r).await
                })
                .await
        })
    }
}

/// jaxlib's Barrier calls, recorded together (`coordination/XlaBarrierArrivals`) and waited on as
/// TensorFlow's are.
pub struct XlaBarriers;

/// jaxlib Barrier arrivals a proxy records together.
pub type XlaBarrierBatches = Gatherer<XlaBarriers>;

impl Gathered for XlaBarriers {
    type Req = xla::BarrierRequest;
    type Answer = xla::BarrierResponse;
    /// The instance: barrier id and counter.
    type Key = (String, i64);

    fn size(arrival: &xla::BarrierRequest) -> Size {
        own_size(arrival)
    }

    fn record(
        client: CoordClient,
        arrivals: Vec<xla::BarrierRequest>,
    ) -> Boxed<Result<Vec<BarrierAnswer>, Status>> {
        Box::pin(async move {
            let req = XlaBarrierArrivalsRequest { arrivals };
            let resp = client
                .forward(req, true, false, |ch, r| async move {
                    CoordinationClient::new(ch).xla_barrier_arrivals(r).await
                })
                .await?;
            Ok(resp.answers)
        })
    }

    fn decided(
        arrival: &xla::BarrierRequest,
        answer: BarrierAnswer,
    ) -> Result<Result<xla::BarrierResponse, Status>, (String, i64)> {
        decided_counter(&arrival.barrier_id, answer)
            .map(|decided| decided.map(|counter| xla::BarrierResponse { counter }))
    }

    fn wait(
        client: CoordClient,
        instance: (String, i64),
        _: xla::BarrierRequest,
    ) -> Boxed<Result<xla::BarrierResponse, Status>> {
        Box::pin(async move {
            let counter = await_instance(client, instance).await?;
            Ok(xla::BarrierResponse { counter })
        })
    }

    fn alone(
        client: CoordClient,
        arrival: xla::BarrierRequest,
    ) -> Boxed<Result<xla::BarrierResponse, Status>> {
        Box::pin(async move {
            client
                .forward(arrival, true, true, |ch, r| async move {
                    XlaServiceClient::new(ch).barrier(r).await
                })
                .await
        })
    }
}

/// TensorFlow WaitForAllTasks calls, recorded together (`coordination/WaitForAllTasksArrivals`).
pub struct WaitsForAll;

/// WaitForAllTasks arrivals a proxy records together.
pub type WaitBatches = Gatherer<WaitsForAll>;

/// Which fields a task reads the job's devices from, told by those it sent its own in (the
/// service answers each form differently): TF 2.21's `device_info`, older releases'
/// `local_device_info` of TF devices or of an XLA topology, or none.
fn answer_form(req: &tf::WaitForAllTasksRequest) -> u8 {
    use tf::coordination_service_device_info::Type;
    match (&req.device_info, &req.local_device_info) {
        (Some(_), _) => 0,
        (None, Some(old)) if matches!(old.r#type, Some(Type::Xla(_))) => 2,
        (None, Some(_)) => 1,
        (None, None) => 3,
    }
}

impl Gathered for WaitsForAll {
    type Req = tf::WaitForAllTasksRequest;
    type Answer = tf::WaitForAllTasksResponse;
    /// The form of the answer: the job gathers once per run, and the answer's devices are the
    /// same for every task.
    type Key = u8;

    fn size(arrival: &tf::WaitForAllTasksRequest) -> Size {
        own_size(arrival)
    }

    fn record(
        client: CoordClient,
        arrivals: Vec<tf::WaitForAllTasksRequest>,
    ) -> Boxed<Result<Vec<BarrierAnswer>, Status>> {
        Box::pin(async move {
            let req = WaitForAllTasksArrivalsRequest { arrivals };
            let resp = client
                .forward(req, true, false, |ch, r| async move {
                    CoordinationClient::new(ch)
                        .wait_for_all_tasks_arrivals(r)
                        .await
                })
                .await?;
            Ok(resp.answers)
        })
    }

    /// An error is the task's own; gathered or not, its devices come with the one call of its
    /// form.
    fn decided(
        arrival: &tf::WaitForAllTasksRequest,
        answer: BarrierAnswer,
    ) -> Result<Result<tf::WaitForAllTasksResponse, Status>, u8> {
        if answer.pending || answer.error_code == 0 {
            return Err(answer_form(arrival));
        }
        Ok(Err(own_error(answer)))
    }

    /// The first waiting task's own call, sent again (its arrival is recorded once): the answer
    /// every task of its form gets.
    fn wait(
        client: CoordClient,
        _: u8,
        arrival: tf::WaitForAllTasksRequest,
    ) -> Boxed<Result<tf::WaitForAllTasksResponse, Status>> {
        Self::alone(client, arrival)
    }

    fn alone(
        client: CoordClient,
        arrival: tf::WaitForAllTasksRequest,
    ) -> Boxed<Result<tf::WaitForAllTasksResponse, Status>> {
        Box::pin(async move {
            let encoded = client
                .forward(arrival, true, true, |ch, r| {
                    fetch_undecoded(ch, r, "/tensorflow.CoordinationService/WaitForAllTasks")
                })
                .await?;
            Ok(tf::WaitForAllTasksResponse {
                encoded,
                ..Default::default()
            })
        })
    }
}

/// Method `path` (WaitForAllTasks, AwaitAlive) on `ch`, gzip accepted (the replicas compress
/// the whole job's answer once), the answer's bytes kept undecoded: every task the proxy hands it
/// to gets the same buffer, written out verbatim (see `coord_proto::wait_answer` and
/// `alive_answer`), where a decoded answer is a tree of the whole job's devices or tasks copied for
/// each of them.
pub(super) async fn fetch_undecoded<Req: prost::Message + Send + 'static>(
    ch: crate::client::Channel,
    req: tonic::Request<Req>,
    path: &'static str,
) -> Result<tonic::Response<bytes::Bytes>, Status> {
    coord_proto::codec::call_undecoded(ch, req, path, super::MESSAGE_LIMIT, true).await
}

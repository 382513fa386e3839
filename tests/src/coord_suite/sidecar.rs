//! What the sidecar checks share: an ensemble with a coord-proxy before it, and every task's call
//! through the proxy at once.

use coord_proto::tensorflow::coordination_service_client::CoordinationServiceClient;

use super::env::{register_all, Env};
use crate::jax::Sidecar;

/// Tasks of the sidecar tests: as many as one host may carry.
pub(super) const TASKS: i32 = 8;

/// An ensemble whose job is [`TASKS`] workers, all registered, a coord-proxy before it, and
/// TensorFlow's client of the proxy.
pub(super) async fn through_a_sidecar(replicas: usize) -> (Env, Sidecar, SidecarClient) {
    let env = Env::start(replicas, &["--job", &format!("worker={TASKS}")]).await;
    let sidecar = Sidecar::start(&env.cluster.endpoints());
    register_all(&env.client, TASKS).await;
    let tf = CoordinationServiceClient::connect(format!("http://{}", sidecar.addr))
        .await
        .expect("connect to the sidecar");
    (env, sidecar, tf)
}

pub(super) type SidecarClient = CoordinationServiceClient<tonic::transport::Channel>;

/// Every task's call through the sidecar at once (`call(client, task id)`), their answers in task
/// order; any failure fails the test.
pub(super) async fn every_task<T, F, Fut>(tf: &SidecarClient, call: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(SidecarClient, i32) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
{
    let calls: Vec<_> = (0..TASKS)
        .map(|i| tokio::spawn(call(tf.clone(), i)))
        .collect();
    let mut answers = Vec::new();
    for (i, c) in calls.into_iter().enumerate() {
        let answer = c.await.expect("join");
        let answer = answer.unwrap_or_else(|s| panic!("task {i} through the sidecar: {s:?}"));
        answers.push(answer.into_inner());
    }
    answers
}

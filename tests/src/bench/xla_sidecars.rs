//! `coord-bench xla-scale`'s GetAliveTasks through sidecars: the same round as the tasks' own
//! calls make, each connection's tasks carried by a coord-proxy sidecar's gatherer
//! ([`XlaAliveBatches`]), which records its tasks' asks together and waits on the round with one
//! call for all of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_agent::proxy::alive::XlaAliveBatches;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::xla::coordination as xla;

use super::tasks::{parked_until, Spawned};

/// The round through sidecars.
pub struct SidecarRound {
    /// From the last task's ask to every task's answer.
    pub answered: Duration,
    /// From the last task's ask to the last sidecar's answer from the ensemble (before it answered
    /// its tasks): the ensemble's part.
    pub sidecars_had_it: Duration,
    /// ... and to the first sidecar's.
    pub first_sidecar_had_it: Duration,
    /// Calls the sidecars sent: asks recorded together, and waits.
    pub calls: u64,
    /// Of those, waits on the round (one per sidecar).
    pub waits: u64,
    /// Calls parked on the leader with every task but the last waiting (those of the round, and
    /// any other the leader holds).
    pub parked: u64,
}

/// Every task of the job asks through its connection's sidecar (`sidecars` of them, over
/// `endpoints`) about the whole job (`ask(i)` is task `i`'s request); timed from the last ask.
/// Task 0's answer, decoded, must list `tasks` tasks alive, and every other answer be as long.
pub async fn alive_round(
    endpoints: &[String],
    sidecars: usize,
    tasks: usize,
    ask: impl Fn(usize) -> xla::GetAliveTasksRequest,
    parked: impl Fn() -> u64,
) -> Result<SidecarRound, String> {
    let carried: Vec<(CoordClient, Arc<XlaAliveBatches>)> = (0..sidecars.max(1))
        .map(|_| {
            let client = CoordClient::new(ClientOptions::new(endpoints.to_vec()))
                .map_err(|e| format!("a sidecar's client: {e}"))?;
            Ok((client, Arc::new(XlaAliveBatches::new(true))))
        })
        .collect::<Result<_, String>>()?;
    let send = |i: usize| {
        let (client, batches) = carried[i % carried.len()].clone();
        let req = ask(i);
        Spawned::new(async move {
            let answer = batches.send(&client, req).await?;
            let at = Instant::now();
            // As the task would read it, off the wire: the sidecar keeps it encoded.
            let bytes = prost::Message::encode_to_vec(&answer);
            let listed = if i == 0 {
                let decoded = <xla::GetAliveTasksResponse as prost::Message>::decode(&bytes[..])
                    .map_err(|e| tonic::Status::internal(e.to_string()))?;
                Some(decoded.alive_task_ids.len())
            } else {
                None
            };
            Ok::<_, tonic::Status>((at, bytes.len(), listed))
        })
    };
    let already = parked();
    let early: Vec<_> = (0..tasks - 1).map(send).collect();
    let waiting = || carried.iter().map(|(_, b)| b.waiting()).sum::<u64>();
    let early = parked_until(early, waiting, (tasks - 1) as u64, "GetAliveTasks").await?;
    let waits_now = carried.iter().filter(|(_, b)| b.waiting() > 0).count() as u64;
    let early = parked_until(early, &parked, already + waits_now, "GetAliveTasks").await?;
    let parked_then = parked();
    let last_ask = Instant::now();
    let mut answered = last_ask;
    let mut sizes = std::collections::BTreeSet::new();
    for (i, call) in early.into_iter().chain([send(tasks - 1)]).enumerate() {
        let (at, size, listed) = call
            .join()
            .await?
            .map_err(|e| format!("GetAliveTasks of task {i} through its sidecar: {e}"))?;
        match listed {
            Some(n) if n != tasks => {
                return Err(format!("task {i} was told {n} of {tasks} tasks are alive"))
            }
            _ => {}
        }
        sizes.insert(size);
        answered = answered.max(at);
    }
    if sizes.len() != 1 {
        return Err(format!(
            "the tasks' answers differ in size: {sizes:?} bytes"
        ));
    }
    let had: Vec<Instant> = carried.iter().filter_map(|(_, b)| b.outcome_at()).collect();
    let after =
        |t: Option<&Instant>| t.map_or(Duration::ZERO, |t| t.saturating_duration_since(last_ask));
    Ok(SidecarRound {
        answered: answered.duration_since(last_ask),
        sidecars_had_it: after(had.iter().max()),
        first_sidecar_had_it: after(had.iter().min()),
        calls: carried.iter().map(|(_, b)| b.calls()).sum(),
        waits: carried.iter().map(|(_, b)| b.waits()).sum(),
        parked: parked_then,
    })
}

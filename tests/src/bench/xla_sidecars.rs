//! `coord-bench xla-scale`'s rounds through sidecars: the same GetAliveTasks round and Barrier as
//! the tasks' own calls make, each connection's tasks carried by a coord-proxy sidecar's gatherer
//! ([`XlaAliveBatches`], [`XlaBarrierBatches`]), which records its tasks' asks or arrivals
//! together and waits on the round or instance with one call for all of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_agent::proxy::alive::{AliveAsk, AskedSet, XlaAliveBatches};
use coord_agent::proxy::arrivals::{Gathered, Gatherer};
use coord_agent::proxy::barriers::XlaBarrierBatches;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::xla::coordination as xla;

use super::tasks::{parked_until, Spawned};

/// A round through sidecars.
pub struct SidecarRound {
    /// From the last task's call to every task's answer.
    pub answered: Duration,
    /// From the last task's call to the last sidecar's answer from the ensemble (before it
    /// answered its tasks): the ensemble's part.
    pub sidecars_had_it: Duration,
    /// ... and to the first sidecar's.
    pub first_sidecar_had_it: Duration,
    /// Calls the sidecars sent: asks or arrivals recorded together, and waits.
    pub calls: u64,
    /// Of those, waits on the round (one per sidecar).
    pub waits: u64,
    /// Calls parked on the leader with every task but the last waiting (those of the round, and
    /// any other the leader holds).
    pub parked: u64,
}

/// `n` sidecars' clients of the ensemble at `endpoints`, each with its gatherer, each sending to
/// the leader as coord-proxy does once it starts (`CoordClient::find_leader`).
async fn sidecars<S>(
    endpoints: &[String],
    n: usize,
    gatherer: impl Fn() -> S,
) -> Result<Vec<(CoordClient, Arc<S>)>, String> {
    let mut carried = Vec::with_capacity(n.max(1));
    for _ in 0..n.max(1) {
        let client = CoordClient::new(ClientOptions::new(endpoints.to_vec()))
            .map_err(|e| format!("a sidecar's client: {e}"))?;
        client
            .find_leader()
            .await
            .ok_or("a sidecar found no leader")?;
        carried.push((client, Arc::new(gatherer())));
    }
    Ok(carried)
}

/// Every task calls through its sidecar (`send(i)`, which answers when it had its answer, and
/// what it checks of it; `gatherer` finds a sidecar's gatherer); timed from the last task's call,
/// once every other task's is waiting on the ensemble. `check(i, what)` fails the round on a
/// wrong answer.
async fn round<S, G, T>(
    carried: &[(CoordClient, Arc<S>)],
    gatherer: fn(&S) -> &Gatherer<G>,
    tasks: usize,
    send: impl Fn(usize) -> Spawned<Result<(Instant, T), tonic::Status>>,
    parked: impl Fn() -> u64,
    what: &str,
    mut check: impl FnMut(usize, T) -> Result<(), String>,
) -> Result<SidecarRound, String>
where
    G: Gathered,
    T: std::fmt::Debug,
{
    let carried: Vec<(&CoordClient, &Gatherer<G>)> =
        carried.iter().map(|(c, b)| (c, gatherer(b))).collect();
    let already = parked();
    let early: Vec<_> = (0..tasks - 1).map(&send).collect();
    let waiting = || carried.iter().map(|(_, b)| b.waiting()).sum::<u64>();
    let early = parked_until(early, waiting, (tasks - 1) as u64, what).await?;
    let waits_now = carried.iter().filter(|(_, b)| b.waiting() > 0).count() as u64;
    let early = parked_until(early, &parked, already + waits_now, what).await?;
    let parked_then = parked();
    let last_call = Instant::now();
    let mut answered = last_call;
    for (i, call) in early.into_iter().chain([send(tasks - 1)]).enumerate() {
        let (at, got) = call
            .join()
            .await?
            .map_err(|e| format!("{what} of task {i} through its sidecar: {e}"))?;
        check(i, got)?;
        answered = answered.max(at);
    }
    let had: Vec<Instant> = carried.iter().filter_map(|(_, b)| b.outcome_at()).collect();
    let after =
        |t: Option<&Instant>| t.map_or(Duration::ZERO, |t| t.saturating_duration_since(last_call));
    Ok(SidecarRound {
        answered: answered.duration_since(last_call),
        sidecars_had_it: after(had.iter().max()),
        first_sidecar_had_it: after(had.iter().min()),
        calls: carried.iter().map(|(_, b)| b.calls()).sum(),
        waits: carried.iter().map(|(_, b)| b.waits()).sum(),
        parked: parked_then,
    })
}

/// Every task of the job asks through its connection's sidecar (`sidecars` of them, over
/// `endpoints`) about the whole job (`all`; `asker(i)` is task `i`'s incarnations and id); timed
/// from the last ask. Task 0's answer, decoded, must list `tasks` tasks alive, and every other
/// answer be as long.
pub async fn alive_round(
    endpoints: &[String],
    sidecars: usize,
    tasks: usize,
    all: Vec<i32>,
    asker: impl Fn(usize) -> (Option<xla::Incarnations>, i32),
    parked: impl Fn() -> u64,
) -> Result<SidecarRound, String> {
    let carried = self::sidecars(endpoints, sidecars, || XlaAliveBatches::new(true)).await?;
    // Every task asks about the same list, read once by each sidecar as a sidecar reads its
    // tasks' asks (this process holding 100,000 copies of a 100,000-task list would not fit).
    let sets: Vec<AskedSet> = (carried.iter())
        .map(|(_, b)| b.set_of(all.clone()))
        .collect();
    let send = |i: usize| {
        let (client, batches) = carried[i % carried.len()].clone();
        let (incarnations, requesting_task_id) = asker(i);
        let ask = AliveAsk {
            incarnations,
            requesting_task_id,
            set: sets[i % carried.len()].clone(),
        };
        Spawned::new(async move {
            let answer = batches.send_ask(&client, ask).await?;
            let at = Instant::now();
            // The sidecar keeps the answer encoded, one buffer for all its tasks, and writes it
            // to each task's connection. Task 0 reads it as a task would, off the wire; the
            // others only count it (this one process writing out 100,000 copies of a 1 MB
            // answer would be the round's cost, where each sidecar writes a few).
            let size = prost::Message::encoded_len(&answer);
            let listed = if i == 0 {
                let bytes = prost::Message::encode_to_vec(&answer);
                let decoded = <xla::GetAliveTasksResponse as prost::Message>::decode(&bytes[..])
                    .map_err(|e| tonic::Status::internal(e.to_string()))?;
                Some(decoded.alive_task_ids.len())
            } else {
                None
            };
            Ok::<_, tonic::Status>((at, (size, listed)))
        })
    };
    let mut sizes = std::collections::BTreeSet::new();
    let check = |i: usize, (size, listed): (usize, Option<usize>)| {
        sizes.insert(size);
        match listed {
            Some(n) if n != tasks => {
                Err(format!("task {i} was told {n} of {tasks} tasks are alive"))
            }
            _ => Ok(()),
        }
    };
    let done = round(
        &carried,
        |b| &**b,
        tasks,
        send,
        parked,
        "GetAliveTasks",
        check,
    )
    .await?;
    if sizes.len() != 1 {
        return Err(format!(
            "the tasks' answers differ in size: {sizes:?} bytes"
        ));
    }
    Ok(done)
}

/// Every task of the job arrives at one XLA Barrier through its connection's sidecar
/// (`arrival(i)` is task `i`'s own request); timed from the last arrival. Every task must pass
/// with the arrivals' counter.
pub async fn barrier_round(
    endpoints: &[String],
    sidecars: usize,
    tasks: usize,
    arrival: impl Fn(usize) -> xla::BarrierRequest,
    parked: impl Fn() -> u64,
) -> Result<SidecarRound, String> {
    let carried = self::sidecars(endpoints, sidecars, || XlaBarrierBatches::new(true)).await?;
    let counter = arrival(0).counter;
    let send = |i: usize| {
        let (client, batches) = carried[i % carried.len()].clone();
        let req = arrival(i);
        Spawned::new(async move {
            let passed = batches.send(&client, req).await?;
            Ok::<_, tonic::Status>((Instant::now(), passed.counter))
        })
    };
    let check = |i: usize, got: i64| match got == counter {
        true => Ok(()),
        false => Err(format!("task {i} passed at counter {got}, not {counter}")),
    };
    round(&carried, |b| b, tasks, send, parked, "Barrier", check).await
}

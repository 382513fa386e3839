//! jaxlib's GetAliveTasks from the tasks a sidecar carries: their asks recorded together, and one
//! wait per round of the set for all of them (see [`super::arrivals`]).
//!
//! GetAliveTasks is a barrier over the live tasks of a set: jax's `live_devices` has every task
//! of the job ask about the whole job, and each call parks on the leader until the last live task
//! asked. A sidecar instead records its tasks' asks without parking them
//! (`coordination/XlaAliveAsks`, each under a request number of its own, as each task's own call
//! is recorded once however often it is sent) and waits on each round its tasks joined with one
//! call (`coordination/AwaitAlive`), whose answer each of them gets: the answer of the round, as
//! its own call would have had it, and the one buffer it came in (undecoded, as WaitForAllTasks'
//! devices are).
//!
//! Every ask lists the set it is about: the whole job, 100,000 task ids (some 300 KB) in each ask
//! of a job that size. The sidecar holds each set its tasks ask about once ([`AskedSet`], shared
//! by every ask of it), a call sends each set once however many of its asks are about it, and the
//! set keys the wait, compared as the one list in memory rather than id by id.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use coord_proto::coord::coordination::{
    AliveSet, AwaitAliveRequest, BarrierAnswer, XlaAliveAsksRequest,
};
use coord_proto::xla::coordination as xla;
use coord_proto::xla::coordination::coordination_service_client::CoordinationServiceClient as XlaServiceClient;
use tonic::Status;

use super::arrivals::{Boxed, Gathered, Gatherer, Size};
use super::barriers::{fetch_undecoded, own_error};
use crate::client::CoordClient;

/// The tasks an ask is about, as a task listed them, held once for every ask of the same list.
/// Two sets are the same set when they are the same list in memory: a sidecar's
/// [`XlaAliveBatches`] hands every ask of a list it saw lately the one it holds, so asks of one
/// set share a call's copy and a wait. (Two copies of one list are two sets here: their asks are
/// waited on twice, and both waits get the round's answer.)
#[derive(Clone, Debug)]
pub struct AskedSet {
    task_ids: Arc<[i32]>,
    /// What the list adds to a call: its ids as varints, and its message's framing.
    wire_bytes: usize,
}

impl AskedSet {
    pub fn new(task_ids: Vec<i32>) -> Self {
        let varints: usize = (task_ids.iter())
            .map(|&id| prost::encoding::encoded_len_varint(i64::from(id) as u64))
            .sum();
        Self {
            task_ids: task_ids.into(),
            wire_bytes: varints + 16,
        }
    }

    pub fn task_ids(&self) -> &[i32] {
        &self.task_ids
    }

    /// The list's place in memory: what tells sets apart.
    fn id(&self) -> usize {
        Arc::as_ptr(&self.task_ids) as *const i32 as usize
    }
}

impl PartialEq for AskedSet {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.task_ids, &other.task_ids)
    }
}

impl Eq for AskedSet {}

impl Hash for AskedSet {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.id().hash(state);
    }
}

/// One task's GetAliveTasks call as the sidecar holds it: the task's own request, its list the
/// set it shares with the other asks of it.
#[derive(Clone, Debug)]
pub struct AliveAsk {
    pub incarnations: Option<xla::Incarnations>,
    pub requesting_task_id: i32,
    pub set: AskedSet,
}

impl AliveAsk {
    /// The ask as its own call, its list written out (sent so to an ensemble without
    /// `XlaAliveAsks`).
    fn own_call(&self) -> xla::GetAliveTasksRequest {
        xla::GetAliveTasksRequest {
            task_ids: self.set.task_ids().to_vec(),
            ..self.without_list()
        }
    }

    /// The ask as `XlaAliveAsks` carries it: its list left out.
    fn without_list(&self) -> xla::GetAliveTasksRequest {
        xla::GetAliveTasksRequest {
            incarnations: self.incarnations,
            requesting_task_id: self.requesting_task_id,
            task_ids: Vec::new(),
        }
    }
}

/// How many sets a sidecar remembers it was asked about (jax asks about the whole job; a task
/// asking about parts of it asks about few).
const RECENT_SETS: usize = 8;

/// jaxlib's GetAliveTasks calls, recorded together.
pub struct XlaAlive;

impl Gathered for XlaAlive {
    type Req = AliveAsk;
    type Answer = xla::GetAliveTasksResponse;
    /// The set asked about and the round of it.
    type Key = (AskedSet, i64);

    /// The ask, its set index and request number; its set once a call.
    fn size(ask: &AliveAsk) -> Size {
        let own = prost::Message::encoded_len(&ask.without_list()) + 16;
        (own, Some((ask.set.id(), ask.set.wire_bytes)))
    }

    fn record(
        client: CoordClient,
        asks: Vec<AliveAsk>,
    ) -> Boxed<Result<Vec<BarrierAnswer>, Status>> {
        Box::pin(async move { client.xla_alive_asks(asks_request(&asks)).await })
    }

    /// An error is the task's own; otherwise the round it joined answers it, finished or not.
    fn decided(
        ask: &AliveAsk,
        answer: BarrierAnswer,
    ) -> Result<Result<xla::GetAliveTasksResponse, Status>, (AskedSet, i64)> {
        if answer.error_code == 0 {
            return Err((ask.set.clone(), answer.counter));
        }
        Ok(Err(own_error(answer)))
    }

    /// The round's answer, its bytes kept as they came: every task gets the one buffer.
    fn wait(
        client: CoordClient,
        (set, generation): (AskedSet, i64),
        _: AliveAsk,
    ) -> Boxed<Result<xla::GetAliveTasksResponse, Status>> {
        Box::pin(async move {
            let req = AwaitAliveRequest {
                task_ids: set.task_ids().to_vec(),
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
        ask: AliveAsk,
    ) -> Boxed<Result<xla::GetAliveTasksResponse, Status>> {
        Box::pin(async move {
            client
                .forward(ask.own_call(), true, true, |ch, r| async move {
                    XlaServiceClient::new(ch)
                        .max_decoding_message_size(super::MESSAGE_LIMIT)
                        .get_alive_tasks(r)
                        .await
                })
                .await
        })
    }
}

/// The call recording `asks`: each set they are about once, each ask naming its set by index.
fn asks_request(asks: &[AliveAsk]) -> XlaAliveAsksRequest {
    let mut index: HashMap<usize, u32> = HashMap::new();
    let mut sets = Vec::new();
    let set = (asks.iter())
        .map(|a| {
            *index.entry(a.set.id()).or_insert_with(|| {
                sets.push(AliveSet {
                    task_ids: a.set.task_ids().to_vec(),
                });
                (sets.len() - 1) as u32
            })
        })
        .collect();
    XlaAliveAsksRequest {
        sets,
        asks: asks.iter().map(AliveAsk::without_list).collect(),
        set,
        ask_seqs: Vec::new(),
    }
}

/// jaxlib's GetAliveTasks asks a proxy records together (a [`Gatherer`], which it derefs to),
/// each set asked about held once.
pub struct XlaAliveBatches {
    asks: Gatherer<XlaAlive>,
    recent: Mutex<VecDeque<AskedSet>>,
}

impl XlaAliveBatches {
    /// Asks recorded together and waited on per round; `together` false sends each task's call on
    /// its own.
    pub fn new(together: bool) -> Self {
        Self {
            asks: Gatherer::new(together),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// Records task `req`'s ask with the other tasks' and answers it, once its round is done, as
    /// its own call would have been answered.
    pub async fn send(
        &self,
        client: &CoordClient,
        req: xla::GetAliveTasksRequest,
    ) -> Result<xla::GetAliveTasksResponse, Status> {
        let ask = AliveAsk {
            incarnations: req.incarnations,
            requesting_task_id: req.requesting_task_id,
            set: self.set_of(req.task_ids),
        };
        self.send_ask(client, ask).await
    }

    /// As [`Self::send`], the ask read already (its set one of [`Self::set_of`]'s, or one its
    /// caller shares between asks itself).
    pub async fn send_ask(
        &self,
        client: &CoordClient,
        ask: AliveAsk,
    ) -> Result<xla::GetAliveTasksResponse, Status> {
        self.asks.send(client, ask).await
    }

    /// The set `task_ids` lists: the one held already if a task asked about the same list lately.
    pub fn set_of(&self, task_ids: Vec<i32>) -> AskedSet {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = recent.iter().position(|s| *s.task_ids == task_ids[..]) {
            let set = recent.remove(i).unwrap_or_else(|| AskedSet::new(task_ids));
            recent.push_front(set.clone());
            return set;
        }
        let set = AskedSet::new(task_ids);
        recent.push_front(set.clone());
        recent.truncate(RECENT_SETS);
        set
    }
}

impl std::ops::Deref for XlaAliveBatches {
    type Target = Gatherer<XlaAlive>;

    /// The gatherer's counts (calls, waits, asks waiting).
    fn deref(&self) -> &Gatherer<XlaAlive> {
        &self.asks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(task: i32, set: &AskedSet) -> AliveAsk {
        AliveAsk {
            incarnations: None,
            requesting_task_id: task,
            set: set.clone(),
        }
    }

    #[test]
    fn asks_of_a_list_seen_lately_share_one_set() {
        let b = XlaAliveBatches::new(true);
        let job = b.set_of(vec![0, 1, 2]);
        assert_eq!(b.set_of(vec![0, 1, 2]), job);
        let part = b.set_of(vec![0, 1]);
        assert_ne!(part, job);
        assert_eq!(b.set_of(vec![0, 1, 2]), job, "still remembered");
        for i in 0..RECENT_SETS as i32 {
            b.set_of(vec![i + 10]);
        }
        assert_ne!(
            b.set_of(vec![0, 1, 2]),
            job,
            "forgotten after {RECENT_SETS} others"
        );
    }

    #[test]
    fn a_call_sends_each_set_once() {
        let job = AskedSet::new((0..1000).collect());
        let part = AskedSet::new(vec![3, 1]);
        let req = asks_request(&[ask(0, &job), ask(1, &part), ask(2, &job)]);
        assert_eq!(req.sets.len(), 2);
        assert_eq!(req.sets[0].task_ids, (0..1000).collect::<Vec<_>>());
        assert_eq!(req.sets[1].task_ids, vec![3, 1]);
        assert_eq!(req.set, vec![0, 1, 0]);
        assert!(req.asks.iter().all(|a| a.task_ids.is_empty()));
        assert_eq!(req.asks[2].requesting_task_id, 2);
        // Alone, the ask is the task's own call again.
        assert_eq!(ask(2, &part).own_call().task_ids, vec![3, 1]);
    }

    #[test]
    fn a_sets_size_is_its_encoding() {
        let ids: Vec<i32> = (0..20_000).collect();
        let set = AskedSet::new(ids.clone());
        let encoded = prost::Message::encoded_len(&AliveSet { task_ids: ids });
        assert!(
            (encoded..encoded + 20).contains(&set.wire_bytes),
            "{} against {encoded}",
            set.wire_bytes
        );
    }
}

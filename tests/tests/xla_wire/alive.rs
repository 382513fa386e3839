//! jaxlib's GetAliveTasks from a sidecar: asks recorded together (`coordination/XlaAliveArrivals`,
//! and `XlaAliveAsks` with each set sent once) and waited on per round (`AwaitAlive`), each ask
//! answered as the task's own call.

use std::time::Duration;

use coord_proto::xla::coordination as xla;
use tonic::transport::Channel;
use tonic::Code;

use super::{env, incarnations, register_both, same_error, Env};

/// A sidecar's client of `env`'s ensemble, as coord-proxy makes it.
fn sidecar(env: &Env) -> coord_agent::CoordClient {
    coord_agent::CoordClient::new(coord_agent::ClientOptions::new(env.cluster.endpoints()))
        .expect("client")
}

/// Task `task`'s GetAliveTasks request about `task_ids`, of the service incarnation `service`.
fn ask(task: i32, task_ids: Vec<i32>, service: u64) -> xla::GetAliveTasksRequest {
    xla::GetAliveTasksRequest {
        incarnations: incarnations(task, service),
        requesting_task_id: task,
        task_ids,
    }
}

/// jaxlib's GetAliveTasks asks recorded together (`coordination/XlaAliveArrivals`, what a
/// coord-proxy sidecar sends) and waited on per round (`coordination/AwaitAlive`): errors as the
/// task's own call's, code, message and payloads alike; each ask the round it joined, and the
/// round's answer the same as the tasks' own calls get; an ask sent again under its number is
/// recorded once; a round no longer kept, or numbers the call cannot carry, refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alive_arrivals_are_answered_as_the_tasks_own_calls() {
    use coord_proto::coord::coordination::coordination_client::CoordinationClient;
    use coord_proto::coord::coordination::XlaAliveArrivalsRequest;
    use coord_proto::metadata::WireRequestId;

    let mut env = env().await;
    let service = register_both(&env).await;
    let c = sidecar(&env);
    // A stale incarnation, a task not of the job, a set with a task not of the job, an asker not
    // in its set.
    let wrong = vec![
        ask(0, vec![0, 1], service ^ 1),
        ask(7, vec![0, 1], service),
        ask(0, vec![0, 9], service),
        ask(0, vec![1], service),
    ];
    let mut sent = wrong.clone();
    sent.push(ask(0, vec![1, 0], service));
    let answers = c.xla_alive_arrivals(sent).await.expect("arrivals");
    assert_eq!(answers.len(), wrong.len() + 1, "one answer per arrival");
    let joined = answers.last().expect("the good one");
    assert!(joined.pending && joined.error_code == 0, "{joined:?}");
    for (i, (a, req)) in answers.iter().zip(wrong).enumerate() {
        assert!(!a.pending && a.error_code != 0, "arrival {i}: {a:?}");
        let own = env.clients[0]
            .clone()
            .get_alive_tasks(req)
            .await
            .expect_err("the task's own call fails");
        same_error(i, a, &own);
    }
    // Task 1 asks with its own call: the round finishes, for the sidecar's wait too.
    let round = joined.counter;
    let waiting = {
        let c = c.clone();
        tokio::spawn(async move { c.await_alive(vec![0, 1], round).await })
    };
    let own = env.clients[1]
        .clone()
        .get_alive_tasks(ask(1, vec![0, 1], service))
        .await
        .expect("task 1's own call")
        .into_inner();
    assert_eq!(own.alive_task_ids, vec![0, 1]);
    assert_eq!(own.incarnations, vec![100, 101]);
    let awaited = waiting.await.expect("join").expect("await");
    assert_eq!(
        awaited, own,
        "the round's answer, as the task's own call got it"
    );

    // An ask sent again under its number (as a call re-driven after a leader change sends it) is
    // the same ask: it joined the round before, not the next one. One sent afresh joins the next.
    let leader = env.cluster.wait_for_leader(Duration::from_secs(30)).await;
    let ch = Channel::from_shared(format!("http://{}", env.cluster.replica(leader).grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let numbered = |seqs: Vec<u64>, with_id: bool| {
        let mut r = tonic::Request::new(XlaAliveArrivalsRequest {
            arrivals: vec![ask(0, vec![0, 1], service)],
            arrival_seqs: seqs,
        });
        if with_id {
            let id = WireRequestId {
                client: 0x5eed,
                seq: 1,
                acked_below: 1,
            };
            id.write(r.metadata_mut());
        }
        r
    };
    let mut raw = CoordinationClient::new(ch);
    let first = raw
        .xla_alive_arrivals(numbered(vec![7], true))
        .await
        .expect("first");
    let next = first.into_inner().answers[0].counter;
    assert_eq!(next, round + 1, "a fresh ask joins the next round");
    c.xla_alive_arrivals(vec![ask(1, vec![0, 1], service)])
        .await
        .expect("task 1 finishes the round");
    let again = raw
        .xla_alive_arrivals(numbered(vec![7], true))
        .await
        .expect("again");
    assert_eq!(again.into_inner().answers[0].counter, next, "recorded once");
    let fresh = c
        .xla_alive_arrivals(vec![ask(0, vec![0, 1], service)])
        .await
        .expect("fresh");
    assert_eq!(
        fresh[0].counter,
        next + 1,
        "a fresh ask joins the round after"
    );

    for (req, names) in [
        (numbered(vec![7, 8], true), "2 numbers for 1 arrivals"),
        (numbered(vec![9], false), "coord-request-id"),
    ] {
        let err = raw.xla_alive_arrivals(req).await.expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(names), "{err:?}");
    }
    // Rounds finish until round `next` is no longer kept; a negative round or a task not of the
    // job is refused by its field.
    for _ in 0..5 {
        let both = vec![ask(0, vec![0, 1], service), ask(1, vec![0, 1], service)];
        c.xla_alive_arrivals(both).await.expect("a whole round");
    }
    let gone = c.await_alive(vec![0, 1], next).await.expect_err("not kept");
    assert_eq!(gone.code(), Code::FailedPrecondition, "{gone:?}");
    assert!(gone.message().contains("no longer kept"), "{gone:?}");
    let negative = c.await_alive(vec![0, 1], -1).await.expect_err("negative");
    assert_eq!(negative.code(), Code::InvalidArgument, "{negative:?}");
    assert!(
        negative.message().starts_with("generation:"),
        "{negative:?}"
    );
    let unknown = c.await_alive(vec![0, 9], 0).await.expect_err("task 9");
    assert_eq!(unknown.code(), Code::InvalidArgument, "{unknown:?}");
    assert!(
        unknown.message().contains("task_ids: task 9"),
        "{unknown:?}"
    );

    let err = c
        .xla_alive_arrivals(vec![ask(0, vec![0, 1], service); 65_537])
        .await
        .expect_err("over the limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("65536"), "{err:?}");
}

/// GetAliveTasks asks with each set sent once (`coordination/XlaAliveAsks`, what coord-proxy
/// sends): each ask answered as the task's own call (the same errors, code, message and payloads,
/// whether its set is shared with other asks or not) and as XlaAliveArrivals answers it; an ask
/// re-sent under its number recorded once; a call whose asks do not name their sets as they must
/// refused by the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alive_asks_share_their_sets_and_are_answered_as_the_tasks_own_calls() {
    use coord_proto::coord::coordination::coordination_client::CoordinationClient;
    use coord_proto::coord::coordination::{AliveSet, XlaAliveAsksRequest};
    use coord_proto::metadata::WireRequestId;

    let mut env = env().await;
    let service = register_both(&env).await;
    let c = sidecar(&env);
    let sets = |lists: &[&[i32]]| -> Vec<AliveSet> {
        (lists.iter())
            .map(|l| AliveSet {
                task_ids: l.to_vec(),
            })
            .collect()
    };
    let asks = |asks: &[(i32, u32, u64)], lists: &[&[i32]]| XlaAliveAsksRequest {
        sets: sets(lists),
        asks: (asks.iter())
            .map(|&(task, _, service)| ask(task, vec![], service))
            .collect(),
        set: asks.iter().map(|&(_, set, _)| set).collect(),
        ask_seqs: vec![],
    };
    // A stale incarnation and a task not of the job, asking about the set the good ask shares; a
    // set with a task not of the job, twice; an asker not in its set.
    let lists: &[&[i32]] = &[&[0, 1], &[0, 9], &[1]];
    let wrong = [
        (0, 0, service ^ 1),
        (7, 0, service),
        (0, 1, service),
        (1, 1, service),
        (0, 2, service),
    ];
    let mut sent = wrong.to_vec();
    sent.push((0, 0, service));
    let answers = c.xla_alive_asks(asks(&sent, lists)).await.expect("asks");
    assert_eq!(answers.len(), sent.len(), "one answer per ask");
    let joined = answers.last().expect("the good one");
    assert!(joined.pending && joined.error_code == 0, "{joined:?}");
    for (i, (a, &(task, set, service))) in answers.iter().zip(&wrong).enumerate() {
        assert!(!a.pending && a.error_code != 0, "ask {i}: {a:?}");
        let req = ask(task, lists[set as usize].to_vec(), service);
        let own_call = env.clients[0]
            .clone()
            .get_alive_tasks(req)
            .await
            .expect_err("the task's own call fails");
        same_error(i, a, &own_call);
    }
    // Task 1's ask finishes the round, whose answer is its own call's.
    let round = joined.counter;
    let last = c
        .xla_alive_asks(asks(&[(1, 0, service)], &[&[1, 0]]))
        .await
        .expect("task 1");
    assert!(!last[0].pending && last[0].error_code == 0, "{last:?}");
    assert_eq!(last[0].counter, round);
    let awaited = c.await_alive(vec![0, 1], round).await.expect("await");
    assert_eq!(awaited.alive_task_ids, vec![0, 1]);
    assert_eq!(awaited.incarnations, vec![100, 101]);

    // Sent again under its number, an ask is recorded once.
    let leader = env.cluster.wait_for_leader(Duration::from_secs(30)).await;
    let ch = Channel::from_shared(format!("http://{}", env.cluster.replica(leader).grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut raw = CoordinationClient::new(ch);
    let numbered = |req: XlaAliveAsksRequest| {
        let mut r = tonic::Request::new(req);
        let id = WireRequestId {
            client: 0xa5c5,
            seq: 1,
            acked_below: 1,
        };
        id.write(r.metadata_mut());
        r
    };
    let mut once = asks(&[(0, 0, service)], &[&[0, 1]]);
    once.ask_seqs = vec![3];
    let first = raw
        .xla_alive_asks(numbered(once.clone()))
        .await
        .expect("first");
    let next = first.into_inner().answers[0].counter;
    assert_eq!(next, round + 1, "a fresh ask joins the next round");
    c.xla_alive_asks(asks(&[(1, 0, service)], &[&[0, 1]]))
        .await
        .expect("task 1 finishes the round");
    let again = raw.xla_alive_asks(numbered(once)).await.expect("again");
    assert_eq!(again.into_inner().answers[0].counter, next, "recorded once");

    // Asks that do not name their sets as they must.
    let mut no_set = asks(&[(0, 0, service)], &[&[0, 1]]);
    no_set.set.clear();
    let mut past = asks(&[(0, 0, service), (1, 1, service)], &[&[0, 1]]);
    past.set[1] = 1;
    let mut listed = asks(&[(0, 0, service)], &[&[0, 1]]);
    listed.asks[0].task_ids = vec![0, 1];
    for (req, names) in [
        (no_set, "set: 0 set indices for 1 asks"),
        (past, "set[1]: no set #1"),
        (listed, "asks[0].task_ids"),
    ] {
        let err = raw.xla_alive_asks(req).await.expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(names), "{err:?}");
    }
    let err = c
        .xla_alive_asks(asks(&vec![(0, 0, service); 65_537], &[&[0, 1]]))
        .await
        .expect_err("over the limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("65536"), "{err:?}");
}

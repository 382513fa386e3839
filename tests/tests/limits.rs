//! Limits: past each one a request fails RESOURCE_EXHAUSTED naming the client (or key) and the
//! flag, nothing changes, and the ensemble keeps serving.

use std::time::Duration;

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_tests::cluster::{Cluster, ClusterOptions};
use tonic::Code;

const TIMEOUT: Duration = Duration::from_secs(60);

async fn cluster_with(args: &[&str]) -> Cluster {
    let mut c = Cluster::start(ClusterOptions {
        extra_args: args.iter().map(|s| s.to_string()).collect(),
        ..ClusterOptions::default()
    });
    c.wait_for_leader(TIMEOUT).await;
    c
}

fn client(c: &Cluster) -> CoordClient {
    CoordClient::new(ClientOptions::new(c.endpoints())).expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_refuses_new_keys_past_max_keys() {
    let c = cluster_with(&["--max-keys", "10"]).await;
    let cl = client(&c);
    for i in 0..10 {
        cl.insert(&format!("k/{i}"), "v", false)
            .await
            .expect("insert");
    }
    let err = cl.insert("k/10", "v", false).await.expect_err("full");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("\"k/10\"") && err.message().contains("--max-keys 10"),
        "{err:?}"
    );
    let err = cl.increment("counter", 1).await.expect_err("full");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    // Nothing was written, existing keys may still change, and room made is room to use.
    assert_eq!(cl.try_get("k/10").await.expect("read"), None);
    cl.insert("k/0", "again", true).await.expect("overwrite");
    cl.delete("k/9").await.expect("delete");
    cl.insert("k/10", "v", false)
        .await
        .expect("insert after a delete");
    assert_eq!(cl.get_dir("k").await.expect("dir").len(), 10);
    assert_eq!(
        cl.try_get("k/0").await.expect("read"),
        Some(Bytes::from("again"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_over_its_request_rate_is_refused_and_others_are_not() {
    let c = cluster_with(&["--max-requests-per-second-per-client", "50"]).await;
    let greedy = client(&c);
    let mut refused = None;
    let mut accepted = 0;
    for i in 0..400 {
        match greedy.insert(&format!("g/{i}"), "v", true).await {
            Ok(()) => accepted += 1,
            Err(e) => {
                refused = Some(e);
                break;
            }
        }
    }
    let err = refused.expect("400 back-to-back writes never hit a 50/s limit");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message()
            .contains("--max-requests-per-second-per-client"),
        "{err:?}"
    );
    assert!(accepted >= 40, "only {accepted} writes before the refusal");
    // Another client is not held back by the greedy one.
    client(&c)
        .insert("other", "v", false)
        .await
        .expect("other client");
    // The greedy client's bucket refills.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while greedy.insert("g/after", "v", true).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "never refilled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_calls_per_client_are_capped() {
    let mut c = cluster_with(&["--max-blocking-calls-per-client", "3"]).await;
    let leader = c.wait_for_leader(TIMEOUT).await;
    let waiter = client(&c);
    let parked: Vec<_> = (0..3)
        .map(|i| {
            let w = waiter.clone();
            tokio::spawn(async move { w.get(&format!("later/{i}")).await })
        })
        .collect();
    // Once the three are parked on the leader (through whichever replica), a fourth is refused.
    c.wait_until(TIMEOUT, "three parked gets", |c| {
        coord_tests::http::get(c.replica(leader).http, "/metrics")
            .is_ok_and(|(_, m)| m.lines().any(|l| l == "coord_parked_calls 3"))
    })
    .await;
    let err = tokio::time::timeout(TIMEOUT, waiter.get("later/3"))
        .await
        .expect("the fourth get was neither refused nor answered")
        .expect_err("a fourth blocking call is refused");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("3 blocking calls") && err.message().contains("GetKeyValue"),
        "{err:?}"
    );
    // Releasing one makes room.
    let other = client(&c);
    other.insert("later/0", "now", false).await.expect("insert");
    let mut parked = parked.into_iter();
    let first = parked.next().expect("first");
    assert_eq!(
        first.await.expect("join").expect("released"),
        Bytes::from("now")
    );
    other.insert("later/3", "too", false).await.expect("insert");
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        match waiter.get("later/3").await {
            Ok(v) => {
                assert_eq!(v, Bytes::from("too"));
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
                assert!(std::time::Instant::now() < deadline, "no room made");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    for p in parked {
        p.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_is_resource_exhausted_and_writes_nothing() {
    use coord_proto::tensorflow::{
        coordination_service_client::CoordinationServiceClient, InsertKeyValueRequest,
        KeyValueEntry,
    };
    let c = cluster_with(&[]).await;
    // Past the 64 MiB a replica decodes at most.
    let mut raw = CoordinationServiceClient::connect(format!("http://{}", c.replica(1).grpc))
        .await
        .expect("connect")
        .max_encoding_message_size(128 << 20);
    let err = raw
        .insert_key_value(InsertKeyValueRequest {
            kv: Some(KeyValueEntry {
                key: "huge".into(),
                value: Bytes::from(vec![7u8; 65 << 20]),
            }),
            allow_overwrite: false,
        })
        .await
        .expect_err("oversized");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("too large"), "{err:?}");
    let cl = client(&c);
    assert_eq!(cl.try_get("huge").await.expect("read"), None);
    cl.insert("small", "fine", false)
        .await
        .expect("still serving");
}

/// The leader's parked calls and watches are bounded across all clients (`--max-parked-calls`):
/// many clients each within their own cap cannot grow it past the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_calls_and_watches_are_bounded_across_all_clients() {
    const BOUND: usize = 40;
    let mut c = cluster_with(&["--max-parked-calls", "40"]).await;
    let leader = c.wait_for_leader(TIMEOUT).await;
    let slots_used = |c: &Cluster, n: usize| {
        coord_tests::http::get(c.replica(leader).http, "/metrics").is_ok_and(|(_, m)| {
            m.lines()
                .any(|l| l == format!("coord_parked_slots_used {n}"))
        })
    };
    // Eight clients (eight connections, eight request-id clients), five blocking gets each.
    let clients: Vec<CoordClient> = (0..8).map(|_| client(&c)).collect();
    let mut parked = Vec::new();
    for (i, cl) in clients.iter().enumerate() {
        for j in 0..BOUND / 8 {
            let cl = cl.clone();
            parked.push(tokio::spawn(async move {
                cl.get(&format!("never/{i}/{j}")).await
            }));
        }
    }
    c.wait_until(TIMEOUT, "40 parked gets", |c| slots_used(c, BOUND))
        .await;

    // A ninth client's blocking get and watch are refused at once, naming the bound.
    let ninth = client(&c);
    let err = tokio::time::timeout(TIMEOUT, ninth.get("never/9"))
        .await
        .expect("the 41st get was neither refused nor answered")
        .expect_err("past the bound");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("--max-parked-calls 40") && err.message().contains("\"never/9\""),
        "{err:?}"
    );
    let err = ninth
        .open_watch("w", 0)
        .await
        .expect_err("a watch past the bound");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("Watch of key \"w\""), "{err:?}");

    // The ensemble keeps serving everything that does not park.
    ninth.insert("k", "v", false).await.expect("insert");
    assert_eq!(
        ninth.get("k").await.expect("a get that need not wait"),
        Bytes::from("v")
    );
    assert!(slots_used(&c, BOUND), "a refused call holds no slot");
    let (_, m) = coord_tests::http::get(c.replica(leader).http, "/metrics").expect("metrics");
    assert!(
        m.lines().any(|l| l == "coord_parked_refused_total 2"),
        "{m}"
    );

    // An answered call gives its slot back, and a new blocking call fits again.
    ninth
        .insert("never/0/0", "now", false)
        .await
        .expect("insert");
    assert_eq!(
        parked.remove(0).await.expect("join").expect("answered"),
        Bytes::from("now")
    );
    c.wait_until(TIMEOUT, "a slot given back", |c| slots_used(c, BOUND - 1))
        .await;
    let late = tokio::spawn({
        let ninth = ninth.clone();
        async move { ninth.get("never/9").await }
    });
    c.wait_until(TIMEOUT, "the late get parked", |c| slots_used(c, BOUND))
        .await;
    ninth
        .insert("never/9", "late", false)
        .await
        .expect("insert");
    assert_eq!(
        late.await.expect("join").expect("answered"),
        Bytes::from("late")
    );
    for p in parked {
        p.abort();
    }
}

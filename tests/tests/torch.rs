//! torch's TCPStore on the ensemble, with real torch 2.15.0 from PyPI (CPU, gloo) in a venv the
//! test makes (it skips, saying why, where PyPI or CPython 3.11 is out of reach).
//!
//! - Conformance: one script of store calls (every query type, timeouts and cancellation,
//!   COMPARE_SET's quirk, blocking calls released by a second client, a 4 MiB value) against
//!   torch's own libuv server and against coord-proxy's, compared call by call.
//! - Bad input closes only the offending connection, with a log line naming the problem.
//! - SIGTERM (a Kubernetes sidecar being stopped) ends coord-proxy with status 0 at once.
//! - torchrun (1 node × 2 workers) trains through two leader kills with the same result.
//! - Many connections' WAITs park one call, and their ADDs go in few calls (`RawKeys.Adds`, each
//!   add applied once, answered in order).

use std::io::{Read, Write};
use std::time::Duration;

use coord_proto::coord::kv as pb;
use coord_proto::coord::kv::raw_keys_client::RawKeysClient;
use coord_tests::cluster::free_ports;
use coord_tests::tcpstore_client::StoreClient;
use coord_tests::torch::{StoreSidecar, Torch};
use coord_tests::torchrun::{finished, torchrun_args, Launched};
use coord_tests::{Cluster, ClusterOptions};
use serde_json::Value;

fn steps(out: &str) -> Vec<Value> {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_gets_the_answers_of_its_own_store() {
    let Some(torch) = Torch::or_skip("torch_gets_the_answers_of_its_own_store") else {
        return;
    };
    let port = free_ports(1)[0];
    let args = vec![
        "127.0.0.1".to_string(),
        port.to_string(),
        "--own-server".into(),
    ];
    let (code, theirs) = torch.run("store_conformance.py", &args, Duration::from_secs(300));
    assert_eq!(code, Some(0), "against torch's own store:\n{theirs}");

    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = StoreSidecar::start(&cluster.endpoints());
    let args = vec!["127.0.0.1".to_string(), sidecar.port.to_string()];
    let (code, ours) = torch.run("store_conformance.py", &args, Duration::from_secs(300));
    assert_eq!(code, Some(0), "against coord-proxy:\n{ours}");

    let (t, o) = (steps(&theirs), steps(&ours));
    // The script is what it claims: it ran to its end, and torch's store answered as its
    // sources say (the quirk, a timeout, a released wait).
    assert_eq!(
        t.last().map(|s| s["step"].clone()),
        Some("done".into()),
        "{theirs}"
    );
    let outcome = |name: &str| {
        t.iter()
            .find(|s| s["step"] == name)
            .map(|s| s["outcome"].clone())
            .unwrap_or_else(|| panic!("no step {name:?} in\n{theirs}"))
    };
    assert_eq!(
        outcome("compare_set missing, non-empty expected (quirk)"),
        serde_json::json!({"ok": "x"})
    );
    assert_eq!(outcome("wait times out")["timeout"], true);
    assert_eq!(
        outcome("wait released by a second client"),
        serde_json::json!({"ok": "here"})
    );
    for (i, (a, b)) in t.iter().zip(&o).enumerate() {
        assert_eq!(
            a, b,
            "step {i} differs\ntorch's store:\n{theirs}\ncoord:\n{ours}"
        );
    }
    assert_eq!(t.len(), o.len(), "torch's store:\n{theirs}\ncoord:\n{ours}");
}

/// A sidecar in a Kubernetes pod is stopped with SIGTERM: it must exit 0 at once, not wait out
/// the pod's grace period, even with a torch client's WAIT parked on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_exits_cleanly_on_sigterm() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let mut sidecar = StoreSidecar::start(&cluster.endpoints());
    let mut client = StoreClient::connect(&sidecar.store).await.expect("connect");
    client.set(b"/here", b"1").await.expect("set");
    client.get(b"/here").await.expect("get");
    client.start_wait(&[b"/never"]).await.expect("wait");
    let asked = std::time::Instant::now();
    sidecar.signal("TERM");
    let status = sidecar
        .wait_exit(Duration::from_secs(10))
        .expect("coord-proxy still running 10 s after SIGTERM");
    eprintln!("coord-proxy: {status} {:?} after SIGTERM", asked.elapsed());
    assert_eq!(status.code(), Some(0), "{status}");
}

/// init_process_group's burst, in small: many connections WAIT for the same key, and the proxy
/// parks one call on the leader for all of them; a SET releases every one. Waiters that cancel
/// give up their places, and when the last has gone the parked call is gone from the leader too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_the_same_key_park_one_call_and_all_are_released() {
    const WAITERS: usize = 32;
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = StoreSidecar::start(&cluster.endpoints());
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let mut c = StoreClient::connect(&sidecar.store).await.expect("connect");
        c.start_wait(&[b"/burst"]).await.expect("wait");
        waiters.push(c);
    }
    let parked = |c: &mut Cluster| c.metric(leader, "coord_parked_calls");
    cluster
        .wait_until(Duration::from_secs(10), "the WAIT parked", |c| {
            parked(c) >= 1.0
        })
        .await;
    // Every waiter's WAIT reached the proxy before the first was answered (none is): one call.
    assert_eq!(
        parked(&mut cluster),
        1.0,
        "one parked call for {WAITERS} waiters"
    );
    let mut setter = StoreClient::connect(&sidecar.store).await.expect("connect");
    setter.set(b"/burst", b"1").await.expect("set");
    for (i, w) in waiters.iter_mut().enumerate() {
        tokio::time::timeout(Duration::from_secs(10), w.waited())
            .await
            .unwrap_or_else(|_| panic!("waiter {i} not released within 10 s"))
            .expect("STOP_WAITING");
    }

    // Cancelled one by one: the others keep waiting, and the last to go takes the call along.
    for w in &mut waiters {
        w.start_wait(&[b"/never"]).await.expect("wait");
    }
    cluster
        .wait_until(Duration::from_secs(10), "the second WAIT parked", |c| {
            parked(c) >= 1.0
        })
        .await;
    let (last, rest) = waiters.split_last_mut().expect("waiters");
    for w in rest {
        w.cancel_wait().await.expect("WAIT_CANCELED");
    }
    assert_eq!(
        parked(&mut cluster),
        1.0,
        "the last waiter's call still parked"
    );
    last.cancel_wait().await.expect("WAIT_CANCELED");
    cluster
        .wait_until(Duration::from_secs(10), "the parked call gone", |c| {
            parked(c) == 0.0
        })
        .await;
    // The connections serve on.
    assert_eq!(last.get(b"/burst").await.expect("get"), b"1");
}

/// Sends `bytes` on a fresh connection and expects the proxy to close it (EOF within the
/// deadline, nothing answered).
fn closed_after(store: &str, bytes: &[u8]) {
    let mut s = std::net::TcpStream::connect(store).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(bytes).expect("write");
    let mut buf = [0u8; 16];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("the proxy answered {:?} to bad input {bytes:?}", &buf[..n]),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the proxy did not close the connection after {bytes:?}: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_closes_only_its_connection() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let mut sidecar = StoreSidecar::start(&cluster.endpoints());
    let validate = [&[0u8][..], &0x3C85_F7CEu32.to_le_bytes()].concat();
    // A good client, kept open across the bad ones.
    let mut good = std::net::TcpStream::connect(&sidecar.store).expect("connect");
    good.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let ping = |s: &mut std::net::TcpStream, nonce: u32| {
        s.write_all(&[&[13u8][..], &nonce.to_le_bytes()].concat())
            .expect("ping");
        let mut echo = [0u8; 4];
        s.read_exact(&mut echo).expect("echo");
        assert_eq!(u32::from_le_bytes(echo), nonce);
    };
    good.write_all(&validate).expect("validate");
    ping(&mut good, 7);

    closed_after(&sidecar.store, &[0, 1, 2, 3, 4]); // bad magic
    closed_after(&sidecar.store, &[1, 0, 0, 0, 0, 0, 0, 0, 0]); // not VALIDATE first
    closed_after(&sidecar.store, &[&validate[..], &[99]].concat()); // unknown query type
    let long_key = [&validate[..], &[3], &(8u64 << 10 | 1).to_le_bytes()].concat();
    closed_after(&sidecar.store, &long_key);
    let big = [
        &validate[..],
        &[1],
        &1u64.to_le_bytes(),
        b"k",
        &((8u64 << 20) + 1).to_le_bytes(),
    ]
    .concat();
    closed_after(&sidecar.store, &big);
    // A truncated frame: the client goes away inside a SET.
    {
        let mut s = std::net::TcpStream::connect(&sidecar.store).expect("connect");
        s.write_all(&[&validate[..], &[1], &9u64.to_le_bytes(), b"/ab"].concat())
            .expect("write");
    }
    // ADD to a value that is not a number: the store refuses it, the connection closes.
    let set = [
        &validate[..],
        &[1],
        &2u64.to_le_bytes(),
        b"/s",
        &3u64.to_le_bytes(),
        b"abc",
    ]
    .concat();
    let add = [&[4u8][..], &2u64.to_le_bytes(), b"/s", &1i64.to_le_bytes()].concat();
    closed_after(&sidecar.store, &[&set[..], &add].concat());

    assert!(sidecar.alive(), "coord-proxy died on bad input");
    ping(&mut good, 8);
    let status = cluster.status(cluster.ids()[0]);
    assert!(status.is_some(), "the ensemble still answers");
}

/// Requests that do not fit coord-proxy's read buffer (1 KiB a connection): 40 SETs sent in one
/// write, frames straddling the buffer's refills, then a 64 KiB value read past the buffer, a
/// PING (answered once every SET before it is committed) and GETs on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_larger_than_the_read_buffer_are_read_whole() {
    use coord_agent::proxy::tcpstore::codec::{query, MAGIC};
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = StoreSidecar::start(&cluster.endpoints());
    let field = |b: &[u8]| [&(b.len() as u64).to_le_bytes()[..], b].concat();
    let value = |i: usize| vec![b'a' + (i % 26) as u8; 100 + i];
    let big: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
    let mut burst = [&[query::VALIDATE][..], &MAGIC.to_le_bytes()].concat();
    for i in 0..40 {
        burst.push(query::SET);
        burst.extend(field(format!("/k{i}").as_bytes()));
        burst.extend(field(&value(i)));
    }
    burst.push(query::SET);
    burst.extend(field(b"/big"));
    burst.extend(field(&big));
    burst.push(query::PING);
    burst.extend(77u32.to_le_bytes());
    assert!(
        burst.len() > 64 << 10,
        "the burst is larger than the buffer"
    );

    let mut s = std::net::TcpStream::connect(&sidecar.store).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.write_all(&burst).expect("write");
    let mut echo = [0u8; 4];
    s.read_exact(&mut echo).expect("the PING's echo");
    assert_eq!(u32::from_le_bytes(echo), 77);
    let mut get = |key: &[u8]| {
        s.write_all(&[&[query::GET][..], &field(key)].concat())
            .expect("GET");
        let mut len = [0u8; 8];
        s.read_exact(&mut len).expect("a GET's length");
        let mut v = vec![0u8; u64::from_le_bytes(len) as usize];
        s.read_exact(&mut v).expect("a GET's value");
        v
    };
    assert!(get(b"/big") == big, "the 64 KiB value came back changed");
    for i in [0, 9, 39] {
        assert_eq!(get(format!("/k{i}").as_bytes()), value(i), "key /k{i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torchrun_trains_through_two_leader_kills() {
    let Some(torch) = Torch::or_skip("torchrun_trains_through_two_leader_kills") else {
        return;
    };
    const STEPS: u64 = 300;
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = StoreSidecar::start(&cluster.endpoints());

    // The reference: the same job with no kill.
    let mut calm = Launched::start(&torch, &torchrun_args(&sidecar.store, "calm", STEPS));
    let (steps, expected) = finished(&mut calm);
    assert_eq!(steps, (0..STEPS).collect::<Vec<_>>());

    let mut job = Launched::start(&torch, &torchrun_args(&sidecar.store, "killed", STEPS));
    for at in [80, 200] {
        job.wait_for(&format!("step {at} "), Duration::from_secs(240));
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        cluster.kill(leader);
        eprintln!("killed leader {leader} at step {at}");
        cluster.wait_for_leader(Duration::from_secs(30)).await;
        cluster.spawn(leader);
    }
    let (steps, result) = finished(&mut job);
    assert_eq!(
        steps,
        (0..STEPS).collect::<Vec<_>>(),
        "every step once, no restart"
    );
    assert_eq!(
        result, expected,
        "the same weights as without kills, and no restart"
    );
}

/// Two torchrun jobs on one ensemble, each through its own sidecar in its own namespace, with the
/// same run id (so the same rendezvous keys): each trains to the result it gets alone, through a
/// leader kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_torchrun_jobs_with_one_run_id_in_two_namespaces() {
    let Some(torch) = Torch::or_skip("two_torchrun_jobs_with_one_run_id_in_two_namespaces") else {
        return;
    };
    const STEPS: u64 = 200;
    let mut cluster = Cluster::start(ClusterOptions::default());
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = |ns: &str| StoreSidecar::start_with(&cluster.endpoints(), &["--namespace", ns]);
    let alone = sidecar("alone");
    let mut reference = Launched::start(&torch, &torchrun_args(&alone.store, "shared", STEPS));
    let (_, expected) = finished(&mut reference);

    let (a, b) = (sidecar("job-a"), sidecar("job-b"));
    let mut jobs = [
        Launched::start(&torch, &torchrun_args(&a.store, "shared", STEPS)),
        Launched::start(&torch, &torchrun_args(&b.store, "shared", STEPS)),
    ];
    jobs[0].wait_for("step 60 ", Duration::from_secs(240));
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    cluster.kill(leader);
    cluster.wait_for_leader(Duration::from_secs(30)).await;
    cluster.spawn(leader);
    for job in &mut jobs {
        let (steps, result) = finished(job);
        assert_eq!(steps, (0..STEPS).collect::<Vec<_>>(), "every step once");
        assert_eq!(result, expected, "the result it gets alone");
    }
}

/// A request id header for a call of client `client` (coord's `<client>.<seq>.<acked_below>`).
fn with_id<T>(msg: T, client: u64, seq: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    let id = format!("{client}.{seq}.1").parse().expect("ascii");
    r.metadata_mut()
        .insert(coord_proto::metadata::REQUEST_ID, id);
    r
}

fn add(key: &[u8], delta: i64) -> pb::RawAddRequest {
    pb::RawAddRequest {
        key: key.to_vec().into(),
        delta,
    }
}

/// `RawKeys.Adds`, coord-proxy's ADDs of many connections in one call: each add applied once
/// under its own number however often the call comes (here through a follower, then again to the
/// leader, then one add alone under its number), answered in order; one add's bad key is its own error among the others' values; a call
/// that breaks the rules is refused whole, naming the rule, and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_in_one_call_apply_once_each_and_answer_in_order() {
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let follower = cluster.other_than(leader);
    let connect = |id: u64| {
        let addr = format!("http://{}", cluster.replica(id).grpc);
        async move { RawKeysClient::connect(addr).await.expect("connect") }
    };
    let (mut via_follower, mut via_leader) = (connect(follower).await, connect(leader).await);
    let long_key = vec![b'k'; 9 * 1024];
    let call = pb::RawAddsRequest {
        adds: vec![
            add(b"/a", 1),
            add(b"/a", 2),
            add(&long_key, 1),
            add(b"/b", 5),
        ],
        add_seqs: vec![11, 12, 13, 14],
    };
    let answers = |r: pb::RawAddsResponse| -> Vec<(i64, i32)> {
        r.answers.iter().map(|a| (a.value, a.error_code)).collect()
    };
    let first = via_follower
        .adds(with_id(call.clone(), 77, 15))
        .await
        .expect("adds")
        .into_inner();
    let bad = tonic::Code::InvalidArgument as i32;
    assert_eq!(answers(first.clone()), [(1, 0), (3, 0), (0, bad), (5, 0)]);
    assert!(
        first.answers[2].error_message.contains("8192"),
        "the long key's own error names the limit: {:?}",
        first.answers[2].error_message
    );
    // The same call again (a proxy re-sending it to the new leader): the same answers, nothing
    // added twice.
    let again = via_leader
        .adds(with_id(call, 77, 15))
        .await
        .expect("adds again")
        .into_inner();
    assert_eq!(again, first);
    // One add of the call on a call of its own under the number it had there (how coord-proxy
    // sends a flight's ADDs again after the call failed as a whole, maybe applied): the value it
    // had in the call, nothing added twice.
    let alone = via_follower
        .add(with_id(add(b"/a", 2), 77, 12))
        .await
        .expect("one add again alone")
        .into_inner();
    assert_eq!(alone.value, 3);
    let now = |c: &mut RawKeysClient<tonic::transport::Channel>| {
        let mut c = c.clone();
        async move {
            let req = pb::RawAddsRequest {
                adds: vec![add(b"/a", 0), add(b"/b", 0)],
                add_seqs: vec![],
            };
            let r = c.adds(req).await.expect("read back").into_inner();
            r.answers.iter().map(|a| a.value).collect::<Vec<_>>()
        }
    };
    assert_eq!(now(&mut via_leader).await, [3, 5]);

    // Refused whole, naming what is wrong, and nothing applied.
    let too_many = pb::RawAddsRequest {
        adds: vec![add(b"/a", 1); 8193],
        add_seqs: vec![],
    };
    let e = via_leader.adds(too_many).await.expect_err("8,193 adds");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("8192"), "{e}");
    let miscounted = pb::RawAddsRequest {
        adds: vec![add(b"/a", 1), add(b"/a", 1)],
        add_seqs: vec![21],
    };
    let e = (via_follower.adds(with_id(miscounted, 78, 22)).await).expect_err("1 number for 2");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("add_seqs"), "{e}");
    let unnamed = pb::RawAddsRequest {
        adds: vec![add(b"/a", 1)],
        add_seqs: vec![31],
    };
    let e = via_leader
        .adds(unnamed)
        .await
        .expect_err("numbers without an id");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("coord-request-id"), "{e}");
    assert_eq!(now(&mut via_leader).await, [3, 5]);
}

/// init_process_group's join counter, in small: connections that ADD while one call of ADDs is
/// out (the leader cannot commit it while both followers are stopped) go together in the next,
/// and each gets a value of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_of_many_connections_go_in_one_call() {
    const RANKS: usize = 64;
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let sidecar = StoreSidecar::start(&cluster.endpoints());
    let mut ranks = Vec::new();
    for _ in 0..RANKS {
        ranks.push(StoreClient::connect(&sidecar.store).await.expect("connect"));
    }
    // The proxy finds the leader with a first ADD, so that the burst's calls go there.
    assert_eq!(ranks[0].add(b"/warm", 1).await.expect("add"), 1);
    let calls = |c: &mut Cluster, method: &str| {
        c.metric(
            leader,
            &format!("coord_rpc_duration_seconds_count{{method=\"{method}\",code=\"OK\"}}"),
        )
    };
    let before = calls(&mut cluster, "raw/Adds");
    let followers: Vec<u64> = (cluster.replicas.iter().map(|r| r.id))
        .filter(|&id| id != leader)
        .collect();
    for &f in &followers {
        cluster.pause(f);
    }
    let burst: Vec<_> = ranks
        .into_iter()
        .map(|mut c| tokio::spawn(async move { c.add(b"/joined", 1).await.expect("add") }))
        .collect();
    // Every ADD reaches the proxy while the first call is out (the 2 s attempt timeout is not
    // reached: the call is answered once the followers go on).
    tokio::time::sleep(Duration::from_millis(700)).await;
    for &f in &followers {
        cluster.resume(f);
    }
    let mut values = Vec::new();
    for b in burst {
        values.push(
            tokio::time::timeout(Duration::from_secs(30), b)
                .await
                .expect("every ADD answered within 30 s")
                .expect("rank"),
        );
    }
    values.sort_unstable();
    assert_eq!(values, (1..=RANKS as i64).collect::<Vec<_>>());
    let sent = calls(&mut cluster, "raw/Adds") - before;
    assert!(
        (1.0..=2.0).contains(&sent),
        "{RANKS} ADDs in {sent} calls: the first, and one for all that came while it was out"
    );
}

/// A call of ADDs that fails as a whole may have been applied (the leader had it in its log when
/// the client gave up); coord-proxy then sends each ADD again on a call of its own, under the
/// number it had in the call, and each is applied once: with both followers stopped the call
/// fails UNAVAILABLE, the leader commits it once they go on, and the ADDs sent again are answered
/// with the values they had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_of_a_call_that_failed_are_sent_again_under_their_numbers() {
    const ADDS: usize = 5;
    let mut cluster = Cluster::start(ClusterOptions::default());
    let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
    let mut options =
        coord_agent::client::ClientOptions::new(vec![cluster.replica(leader).grpc.to_string()]);
    options.attempt_timeout = Duration::from_millis(300);
    options.unavailable_after = Duration::from_secs(1);
    let client = coord_agent::client::CoordClient::new(options).expect("client");
    let counter = || async {
        let read = client.raw_adds(vec![add(b"/n", 0)]).await;
        read.map_err(|f| f.status).expect("read the counter")[0].value
    };
    assert_eq!(counter().await, 0);
    let followers: Vec<u64> = (cluster.replicas.iter().map(|r| r.id))
        .filter(|&id| id != leader)
        .collect();
    for &f in &followers {
        cluster.pause(f);
    }
    let failed = match client.raw_adds(vec![add(b"/n", 1); ADDS]).await {
        Ok(answers) => panic!("no majority, yet answered: {answers:?}"),
        Err(failed) => failed,
    };
    assert_eq!(
        failed.status.code(),
        tonic::Code::Unavailable,
        "{}",
        failed.status
    );
    assert_eq!(failed.len(), ADDS);
    for &f in &followers {
        cluster.resume(f);
    }
    // The leader, if it still leads, commits the call now; if it does not, the call is lost.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut applied = counter().await;
    while applied != ADDS as i64 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        applied = counter().await;
    }
    assert!(
        applied == 0 || applied == ADDS as i64,
        "{applied} of the call's {ADDS} adds applied"
    );
    let mut values = (failed.each_alone(&client).await.into_iter())
        .map(|v| v.expect("an add sent again"))
        .collect::<Vec<_>>();
    values.sort_unstable();
    assert_eq!(
        values,
        (1..=ADDS as i64).collect::<Vec<_>>(),
        "the call applied: {applied}"
    );
    assert_eq!(counter().await, ADDS as i64);
}

//! The rendezvous in one process: local sends and receives in both orders, abort, cleanup, and a
//! remote receive over a real loopback link between two managers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::direct;
use super::link::LinkService;
use super::links::{Directory, Links};
use super::*;

const W1: &str = "/job:worker/replica:0/task:1";
const W2: &str = "/job:worker/replica:0/task:2";

fn key(src_task: &str, dst_task: &str, name: &str) -> ParsedKey {
    ParsedKey::parse(&format!(
        "{src_task}/device:CPU:0;0000000000000001;{dst_task}/device:CPU:0;{name};0:0"
    ))
    .expect("key")
}

fn tensor(n: usize, fill: u8) -> Tensor {
    Tensor::new(DType::UInt8, vec![n as i64], Bytes::from(vec![fill; n])).expect("tensor")
}

fn no_links() -> Links {
    Links::new(Arc::new(|task: String| {
        Box::pin(async move { Err(RendezvousError::unavailable(format!("no link to {task}"))) })
    }))
}

/// Links whose address lookups never finish: a remote receive waits.
fn unresolved_links() -> Links {
    Links::new(Arc::new(|_task: String| Box::pin(std::future::pending())))
}

fn session(task: &str, links: Links) -> WorkerSession {
    WorkerSession {
        task: task.to_string(),
        links,
    }
}

#[tokio::test]
async fn local_send_then_recv_and_recv_then_send() {
    let mgr = RendezvousMgr::new();
    let r = mgr.find(7);
    let k = key(W1, W1, "a");
    // Send works before initialize and never blocks.
    r.send(&k, tensor(4, 1), false).expect("send");
    r.initialize(session(W1, no_links())).expect("initialize");
    assert!(r.initialize(session(W1, no_links())).is_err());
    let got = r.recv(&k).await.expect("recv");
    assert_eq!(got.tensor, tensor(4, 1));
    assert!(!got.is_dead);

    // The buffer is handed over, not copied.
    let t = tensor(1024, 2);
    let ptr = t.data().as_ptr();
    let pending = {
        let r = r.clone();
        let k = key(W1, W1, "b");
        tokio::spawn(async move { r.recv(&k).await })
    };
    tokio::task::yield_now().await;
    r.send(&key(W1, W1, "b"), t, true).expect("send");
    let got = pending.await.expect("join").expect("recv");
    assert!(got.is_dead);
    assert_eq!(got.tensor.data().as_ptr(), ptr);

    // The callback form, as the link's handler in TF uses it.
    let (tx, rx) = tokio::sync::oneshot::channel();
    mgr.recv_local_async(7, key(W1, W1, "d"), move |r| {
        let _ = tx.send(r);
    });
    r.send(&key(W1, W1, "d"), tensor(2, 9), false)
        .expect("send");
    assert_eq!(rx.await.expect("done").expect("recv").tensor, tensor(2, 9));

    // Two sends of one key are two receives, in order.
    let k = key(W1, W1, "c");
    r.send(&k, tensor(1, 1), false).expect("send");
    r.send(&k, tensor(1, 2), false).expect("send");
    assert_eq!(r.recv(&k).await.expect("first").tensor, tensor(1, 1));
    assert_eq!(r.recv(&k).await.expect("second").tensor, tensor(1, 2));
    assert_eq!(r.pending(), 0);
}

#[tokio::test]
async fn abort_fails_waiting_and_later_calls() {
    let mgr = RendezvousMgr::new();
    let r = mgr.find(1);
    r.initialize(session(W1, unresolved_links()))
        .expect("initialize");
    let waiting = {
        let r = r.clone();
        tokio::spawn(async move { r.recv(&key(W1, W1, "x")).await })
    };
    // A receive of a remote tensor waits too, and is failed by the abort as well.
    let remote = {
        let r = r.clone();
        tokio::spawn(async move { r.recv(&key(W2, W1, "y")).await })
    };
    tokio::task::yield_now().await;
    r.start_abort(RendezvousError::aborted("step failed: out of memory"));
    r.start_abort(RendezvousError::aborted("a second abort is not reported"));
    for h in [waiting, remote] {
        let err = tokio::time::timeout(Duration::from_secs(5), h)
            .await
            .expect("prompt")
            .expect("join")
            .expect_err("aborted");
        assert_eq!(err.code, tonic::Code::Aborted);
        assert_eq!(err.message, "step failed: out of memory");
    }
    assert!(r.send(&key(W1, W1, "x"), tensor(1, 0), false).is_err());
    assert!(r.recv(&key(W1, W1, "x")).await.is_err());
}

#[tokio::test]
async fn cleanup_frees_every_step_and_refuses_late_requests() {
    let mgr = RendezvousMgr::new();
    for step in 0..10_000 {
        let r = mgr.find(step);
        r.initialize(session(W1, no_links())).expect("initialize");
        let k = key(W1, W2, "t");
        r.send(&k, tensor(64, step as u8), false).expect("send");
        if step % 2 == 0 {
            mgr.recv_local(step, &k).await.expect("recv");
        }
        mgr.cleanup(step);
    }
    assert_eq!(mgr.live_steps(), 0);
    // A peer asking for a tensor of a cleaned-up step is told so, and the step is not re-made.
    let err = mgr
        .recv_local(9_999, &key(W1, W2, "t"))
        .await
        .expect_err("cleaned up");
    assert!(err.message.contains("step 9999 was cleaned up"), "{err}");
    assert_eq!(mgr.live_steps(), 0);

    let waiting = {
        let mgr = mgr.clone();
        tokio::spawn(async move { mgr.recv_local(20_000, &key(W1, W2, "u")).await })
    };
    tokio::task::yield_now().await;
    mgr.cleanup_all();
    assert!(waiting.await.expect("join").is_err());
    assert_eq!(mgr.live_steps(), 0);
}

/// Serves `mgr`'s link for `task` on a loopback port (gRPC and the direct link); returns the
/// address.
async fn serve(mgr: RendezvousMgr, task: &str, incarnation: u64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("addr").to_string();
    let service = LinkService::new(mgr, task, incarnation);
    tokio::spawn(async move {
        let _ = service.serve(listener).await;
    });
    address
}

/// Serves `mgr`'s link over gRPC alone, as a worker that predates the direct link.
async fn serve_grpc_only(mgr: RendezvousMgr, task: &str, incarnation: u64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("addr").to_string();
    let service = LinkService::new(mgr, task, incarnation).into_server();
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = LinkService::server_builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    address
}

/// A link served on a runtime of its own: dropping it ends the server and every connection to
/// it, as a process exit would.
fn serve_on_own_runtime(task: &str, incarnation: u64) -> (String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let address = rt.block_on(serve(RendezvousMgr::new(), task, incarnation));
    (address, rt)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_restarted_at_a_new_address_is_found_again() {
    let addresses = Arc::new(std::sync::Mutex::new(HashMap::<String, String>::new()));
    let directory: Directory = {
        let addresses = addresses.clone();
        Arc::new(move |task: String| {
            let found = addresses.lock().expect("lock").get(&task).cloned();
            Box::pin(async move {
                found.ok_or_else(|| RendezvousError::unavailable(format!("no address for {task}")))
            })
        })
    };
    let links = Links::new(directory);
    let (first, server) = tokio::task::block_in_place(|| serve_on_own_runtime(W1, 1));
    addresses.lock().expect("lock").insert(W1.into(), first);
    assert_eq!(
        links
            .heartbeat(W1, W2, Duration::from_secs(5))
            .await
            .expect("up"),
        1
    );

    // The peer dies and comes back elsewhere, publishing its new address.
    server.shutdown_background();
    let (second, server) = tokio::task::block_in_place(|| serve_on_own_runtime(W1, 2));
    addresses.lock().expect("lock").insert(W1.into(), second);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match links.heartbeat(W1, W2, Duration::from_secs(2)).await {
            Ok(incarnation) => {
                assert_eq!(incarnation, 2, "still talking to the old incarnation");
                break;
            }
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "never found again: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    server.shutdown_background();
}

fn static_links(addresses: HashMap<String, String>) -> Links {
    let addresses = Arc::new(addresses);
    let directory: Directory = Arc::new(move |task: String| {
        let found = addresses.get(&task).cloned();
        Box::pin(async move {
            found.ok_or_else(|| RendezvousError::unavailable(format!("no address for {task}")))
        })
    });
    Links::new(directory)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tensor_crosses_a_loopback_link_in_chunks() {
    let producer = RendezvousMgr::new();
    let address = serve(producer.clone(), W1, 11).await;
    let links = static_links(HashMap::from([(W1.to_string(), address.clone())]));
    let consumer = RendezvousMgr::new();
    let r = consumer.find(3);
    r.initialize(session(W2, links.clone()))
        .expect("initialize");

    // Larger than several chunks and not a multiple of the chunk size.
    let n = 2 * wire::CHUNK_BYTES + 123;
    let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    let sent = Tensor::new(DType::UInt8, vec![n as i64], Bytes::from(data)).expect("tensor");
    let k = key(W1, W2, "big");
    let receive = {
        let r = r.clone();
        let k = k.clone();
        tokio::spawn(async move { r.recv(&k).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    producer
        .find(3)
        .send(&k, sent.clone(), false)
        .expect("send");
    let got = tokio::time::timeout(Duration::from_secs(30), receive)
        .await
        .expect("prompt")
        .expect("join")
        .expect("recv");
    assert_eq!(got.tensor, sent);
    assert_eq!(
        links.idle_direct(W1),
        Some(1),
        "not received over the direct link"
    );
    assert_eq!(
        links
            .heartbeat(W1, W2, Duration::from_secs(5))
            .await
            .expect("heartbeat"),
        11
    );

    // A key the link does not produce is refused, naming both tasks.
    let err = links
        .fetch(W1, 3, &key(W2, W1, "wrong"), W2)
        .await
        .expect_err("not produced there");
    assert_eq!(err.code, tonic::Code::InvalidArgument);
    assert!(
        err.message.contains(W2) && err.message.contains(W1),
        "{err}"
    );

    // A malformed key off the wire is refused with the offending part named, by either
    // transport of the port.
    let mut conn = direct::Conn::connect(&address).await.expect("connect");
    let malformed = coord_proto::coord::link::RecvTensorRequest {
        step_id: 3,
        key: format!("{W1}/device:CPU:0;zz;{W2}/device:CPU:0;t;0:0"),
        receiver: W2.into(),
    };
    match conn.call(&malformed, &Arc::default()).await {
        Err(direct::CallError::Status(s)) => {
            assert_eq!(s.code(), tonic::Code::InvalidArgument);
            assert!(s.message().contains("\"zz\" is not hexadecimal"), "{s}");
        }
        other => panic!("a malformed key was not refused: {:?}", other.map(|_| ())),
    }
    let mut raw = coord_proto::coord::link::worker_link_client::WorkerLinkClient::connect(format!(
        "http://{address}"
    ))
    .await
    .expect("connect");
    let err = raw
        .recv_tensor(coord_proto::coord::link::RecvTensorRequest {
            step_id: 3,
            key: format!("{W1}/device:CPU:0;zz;{W2}/device:CPU:0;t;0:0"),
            receiver: W2.into(),
        })
        .await
        .expect_err("malformed");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("\"zz\" is not hexadecimal"), "{err}");

    // A worker that predates the direct link still receives over gRPC from this port.
    let sent = tensor(3 * wire::CHUNK_BYTES / 2, 4);
    producer
        .find(3)
        .send(&key(W1, W2, "grpc"), sent.clone(), false)
        .expect("send");
    let mut chunks = raw
        .recv_tensor(coord_proto::coord::link::RecvTensorRequest {
            step_id: 3,
            key: key(W1, W2, "grpc").as_str().to_string(),
            receiver: W2.into(),
        })
        .await
        .expect("over gRPC")
        .into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = chunks.message().await.expect("chunk") {
        data.extend_from_slice(&chunk.data);
    }
    assert_eq!(data, sent.data().as_ref());

    // A peer declared dead fails the receives waiting on it at once.
    let waiting = {
        let r = r.clone();
        tokio::spawn(async move { r.recv(&key(W1, W2, "never")).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    links.declare_dead(W1, RendezvousError::unavailable("peer gone"));
    let err = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("prompt")
        .expect("join")
        .expect_err("dead peer");
    assert_eq!(err.message, "peer gone");
}

/// Sends one tensor of `n` bytes as `name` in step `step` of `producer`; returns it.
fn produce(producer: &RendezvousMgr, step: i64, name: &str, n: usize) -> Tensor {
    let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
    let t = Tensor::new(DType::UInt8, vec![n as i64], Bytes::from(data)).expect("tensor");
    producer
        .find(step)
        .send(&key(W1, W2, name), t.clone(), false)
        .expect("send");
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_serves_only_grpc_is_received_from_over_grpc() {
    let producer = RendezvousMgr::new();
    let address = serve_grpc_only(producer.clone(), W1, 5).await;
    let links = static_links(HashMap::from([(W1.to_string(), address)]));
    for (step, n) in [(1, 4096), (2, 3 * wire::CHUNK_BYTES + 7), (3, 0)] {
        let sent = produce(&producer, step, "t", n);
        let got = tokio::time::timeout(
            Duration::from_secs(30),
            links.fetch(W1, step, &key(W1, W2, "t"), W2),
        )
        .await
        .expect("prompt")
        .expect("recv");
        assert_eq!(got.tensor, sent);
        assert_eq!(links.idle_direct(W1), None, "still trying the direct link");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_link_tensors_of_every_size_and_given_up_receives() {
    let producer = RendezvousMgr::new();
    let address = serve(producer.clone(), W1, 9).await;
    let links = static_links(HashMap::from([(W1.to_string(), address)]));
    let fetch = |step: i64, name: &'static str| {
        let links = links.clone();
        async move { links.fetch(W1, step, &key(W1, W2, name), W2).await }
    };
    // Empty, small, and large enough for the reused buffers (twice, so one is reused).
    for (step, n) in [(1, 0), (2, 4096), (3, 5 << 20), (4, 5 << 20)] {
        let sent = produce(&producer, step, "t", n);
        let got = fetch(step, "t").await.expect("recv");
        assert_eq!(got.tensor, sent);
        assert_eq!(got.tensor.data().len(), n);
    }
    assert_eq!(links.idle_direct(W1), Some(1), "one connection, reused");

    // A receive given up while the producer waits for the tensor drops its connection; the
    // producer then keeps the tensor for the next receive.
    let gave_up = tokio::time::timeout(Duration::from_millis(50), fetch(5, "late")).await;
    assert!(gave_up.is_err(), "received a tensor never sent");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let sent = produce(&producer, 5, "late", 100);
    let got = tokio::time::timeout(Duration::from_secs(10), fetch(5, "late"))
        .await
        .expect("prompt")
        .expect("recv");
    assert_eq!(got.tensor, sent);
    assert_eq!(producer.find(5).pending(), 0);

    // An error at the producer (here an aborted step) crosses the direct link with its code.
    producer
        .find(6)
        .start_abort(RendezvousError::aborted("step 6 failed"));
    let err = fetch(6, "t").await.expect_err("aborted");
    assert_eq!(err.code, tonic::Code::Aborted, "{err}");
    assert!(err.message.contains("step 6 failed"), "{err}");
}

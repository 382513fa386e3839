//! torch's TCPStore on the ensemble, with real torch 2.15.0 from PyPI (CPU, gloo) in a venv the
//! test makes (it skips, saying why, where PyPI or CPython 3.11 is out of reach).
//!
//! - Conformance: one script of store calls (every query type, timeouts and cancellation,
//!   COMPARE_SET's quirk, blocking calls released by a second client, a 4 MiB value) against
//!   torch's own libuv server and against coord-proxy's, compared call by call.
//! - Bad input closes only the offending connection, with a log line naming the problem.

use std::io::{Read, Write};
use std::time::Duration;

use coord_tests::cluster::free_ports;
use coord_tests::torch::{StoreSidecar, Torch};
use coord_tests::{Cluster, ClusterOptions};
use serde_json::Value;

fn torch_or_skip(test: &str) -> Option<Torch> {
    match Torch::get() {
        Ok(t) => Some(t),
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

fn steps(out: &str) -> Vec<Value> {
    out.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torch_gets_the_answers_of_its_own_store() {
    let Some(torch) = torch_or_skip("torch_gets_the_answers_of_its_own_store") else {
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

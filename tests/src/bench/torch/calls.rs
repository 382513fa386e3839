//! Single store calls, one at a time on one connection, as a torch process makes them: the
//! latency of each, against any TCPStore address (torch's own server or coord-proxy), with the
//! same client ([`crate::tcpstore_client`]) for both.

use std::time::{Duration, Instant};

use crate::tcpstore_client::StoreClient;

/// The calls measured, in the order of the report.
pub const CALLS: [&str; 5] = [
    "SET (until a PING behind it is answered)",
    "GET (torch's WAIT + GET)",
    "ADD",
    "COMPARE_SET",
    "WAIT released by another client's SET",
];

/// Each call's latencies (`samples` of each, after a warm-up), sorted, in the order of
/// [`CALLS`]. Keys live under `/{tag}` so that rounds do not meet.
pub async fn measure(addr: &str, samples: usize, tag: &str) -> Result<Vec<Vec<Duration>>, String> {
    let io = |e: std::io::Error| format!("store at {addr}: {e}");
    let mut c = StoreClient::connect(addr).await.map_err(io)?;
    let mut other = StoreClient::connect(addr).await.map_err(io)?;
    let key = |name: &str| format!("/{tag}/{name}").into_bytes();
    let value = vec![7u8; 64];
    let warm = samples / 10 + 10;
    let mut out = Vec::new();

    // SET has no reply: a PING behind it ends the call. Both servers answer a connection's
    // requests in turn, so the PING is answered once the SET is stored (on coord: committed).
    let mut set = Vec::with_capacity(samples);
    for i in 0..warm + samples {
        let t = Instant::now();
        c.set(&key("set"), &value).await.map_err(io)?;
        c.ping().await.map_err(io)?;
        if i >= warm {
            set.push(t.elapsed());
        }
    }
    out.push(set);

    let mut get = Vec::with_capacity(samples);
    for i in 0..warm + samples {
        let t = Instant::now();
        c.get(&key("set")).await.map_err(io)?;
        if i >= warm {
            get.push(t.elapsed());
        }
    }
    out.push(get);

    let mut add = Vec::with_capacity(samples);
    for i in 0..warm + samples {
        let t = Instant::now();
        c.add(&key("add"), 1).await.map_err(io)?;
        if i >= warm {
            add.push(t.elapsed());
        }
    }
    out.push(add);

    let mut cas = Vec::with_capacity(samples);
    let mut current = Vec::new();
    for i in 0..warm + samples {
        let desired = format!("v{i}").into_bytes();
        let t = Instant::now();
        let now = c
            .compare_set(&key("cas"), &current, &desired)
            .await
            .map_err(io)?;
        if i >= warm {
            cas.push(t.elapsed());
        }
        if now != desired {
            return Err(format!("COMPARE_SET on {addr} did not swap: {now:?}"));
        }
        current = desired;
    }
    out.push(cas);

    // A parked WAIT released by another connection's SET: from the SET sent to STOP_WAITING read.
    // The WAIT is given a moment to park first, as a rank waiting for its peers would be.
    let mut released = Vec::with_capacity(samples);
    let waits = samples.min(500);
    for i in 0..warm.min(50) + waits {
        let k = key(&format!("wait/{i}"));
        c.start_wait(&[&k]).await.map_err(io)?;
        tokio::time::sleep(Duration::from_millis(2)).await;
        let t = Instant::now();
        other.set(&k, b"1").await.map_err(io)?;
        tokio::time::timeout(Duration::from_secs(30), c.waited())
            .await
            .map_err(|_| format!("a WAIT on {addr} was not released within 30 s"))?
            .map_err(io)?;
        if i >= warm.min(50) {
            released.push(t.elapsed());
        }
    }
    out.push(released);
    for v in &mut out {
        v.sort_unstable();
    }
    Ok(out)
}

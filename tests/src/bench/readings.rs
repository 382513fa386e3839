//! What the benches read of the processes they start and of the ensemble's replicas: a
//! process's CPU time and resident memory from `/proc`, and a replica's metrics from its
//! `/metrics`, alone or summed over the ensemble.

/// CPU time (user + system) of a process, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Resident memory of a process, in bytes.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Calls the replica serving metrics at `http` holds parked (0 if it does not answer).
pub fn parked_calls(http: std::net::SocketAddr) -> u64 {
    metric(http, "coord_parked_calls").map_or(0, |v| v as u64)
}

/// A metric (a sample without labels) summed over `cluster`'s replicas, 0 where one does not
/// answer: what `tasks::run` reads of the ensemble.
pub fn summed(cluster: &crate::Cluster) -> impl Fn(&str) -> u64 {
    let https: Vec<std::net::SocketAddr> = cluster
        .ids()
        .iter()
        .map(|&id| cluster.replica(id).http)
        .collect();
    move |name| {
        https
            .iter()
            .map(|&http| metric(http, name).map_or(0, |v| v as u64))
            .sum()
    }
}

/// The value of metric `name` (a sample without labels) at `http`'s `/metrics`; none if the
/// replica does not answer or does not report it (an older build).
pub fn metric(http: std::net::SocketAddr, name: &str) -> Option<f64> {
    let (_, m) = crate::http::get(http, "/metrics").ok()?;
    m.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse::<f64>().ok())
}

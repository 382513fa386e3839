//! Outage: `kill -9` of the dispatcher, and the time to the next split a fake worker gets.

use std::path::Path;
use std::time::Duration;

use coord_tools::ensemble::DEFAULT_LOG_FILTER;
use serde_json::Value;

use crate::cluster::free_ports;
use crate::Cluster;

use super::harness::{ensemble, keep_if_asked, start_proxy, wall, Args, START_PATIENCE};
use super::script::{tf_dispatcher, Script};

/// The fake worker's outage after a kill at `killed_at` (wall time).
pub(super) struct Outage {
    /// From the kill to the next split answered.
    pub(super) seconds: f64,
    /// Splits skipped across the outage (handed out, never answered); negative: handed out again.
    pub(super) lost: i64,
    pub(super) errors: Value,
}

/// The outage after a kill is the longest wait for a split that began within this long of it.
const OUTAGE_WINDOW: Duration = Duration::from_secs(5);

/// Waits for the end of the outage after `killed_at`: the fake worker's answer that ended its
/// longest wait after the kill (not its first answer after it: one already on its way, or a
/// split coord-proxy held, can come first); logs it as `who`'s.
pub(super) async fn next_split(
    s: &mut Script,
    killed_at: f64,
    who: &str,
) -> Result<Outage, String> {
    let window = OUTAGE_WINDOW.as_secs_f64();
    s.send(&format!("since {killed_at} {window}"));
    let asked = |e: &Value| {
        e["since"]
            .as_f64()
            .is_some_and(|t| (t - killed_at).abs() < 1e-6)
    };
    let pick = |e: &Value| (e["event"] == "after" && asked(e)).then(|| e.clone());
    let next = s.wait("split after the kill", START_PATIENCE, pick).await?;
    let o = Outage {
        seconds: next["wall"].as_f64().unwrap_or(f64::NAN) - killed_at,
        lost: next["split"].as_i64().unwrap_or(0) - next["expected"].as_i64().unwrap_or(0),
        errors: next["errors"].clone(),
    };
    eprintln!(
        "  {who}: next split {:.3} s after the kill; {} split(s) skipped; failed calls meanwhile {}",
        o.seconds, o.lost, o.errors
    );
    Ok(o)
}

/// Waits until the fake worker has answered steadily for a second past now; returns that
/// second's GetSplit latency p50 (ms).
pub(super) async fn steady(splits: &Script) -> Result<f64, String> {
    let after = wall() + 1.0;
    let pick = |e: &Value| {
        let progress = e["event"] == "progress" && e["wall"].as_f64() > Some(after);
        progress.then(|| e["p50_ms"].as_f64().unwrap_or(f64::NAN))
    };
    splits
        .wait("steady progress", Duration::from_secs(60), pick)
        .await
}

/// What the outage runs measured (seconds from the kill to the next split, per kill).
#[derive(Default)]
pub(super) struct Outages {
    pub(super) coord: Vec<f64>,
    /// From the kill until a new leader served (read from the replicas' logs).
    pub(super) coord_elected: Vec<f64>,
    pub(super) tf_restart: Vec<f64>,
    pub(super) tf_standby: Vec<f64>,
    /// GetSplit p50 (ms) of one caller, no kill: through coord-proxy, to coord's leader
    /// directly, and to TF's dispatcher.
    pub(super) coord_p50: Vec<f64>,
    pub(super) coord_direct_p50: Vec<f64>,
    pub(super) tf_p50: Vec<f64>,
    pub(super) lost: Vec<String>,
}

pub(super) async fn tf_outages(
    python: &Path,
    args: &Args,
    out: &mut Outages,
) -> Result<(), String> {
    let work_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let (port, dir) = (free_ports(1)[0], work_dir.path());
    let mut current = tf_dispatcher(python, port, dir, false)?;
    current.event("ready", START_PATIENCE).await?;
    let address = format!("localhost:{port}");
    let args_ = ["splits", "--dispatcher", &address];
    let mut splits = Script::start(python, &args_, "TF fake worker")?;
    splits.event("ready", START_PATIENCE).await?;
    for k in 0..2 * args.kills {
        let standby = k % 2 == 1;
        let mut waiting = None;
        if standby {
            let s = tf_dispatcher(python, port, dir, true)?;
            s.event("imported", START_PATIENCE).await?;
            waiting = Some(s);
        }
        out.tf_p50.push(steady(&splits).await?);
        let killed_at = current.kill();
        let next = match waiting {
            Some(mut s) => {
                s.send("go");
                s
            }
            None => tf_dispatcher(python, port, dir, false)?,
        };
        let kind = if standby { "standby" } else { "restart" };
        let who = format!("TF {kind}");
        // A dispatcher that fails to come up ends the wait at once, with its own stderr.
        let failed = next.wait("first split after the kill", START_PATIENCE, |_| None::<()>);
        let o = tokio::select! {
            o = next_split(&mut splits, killed_at, &who) => o?,
            Err(e) = failed => return Err(e),
        };
        let ready = next.event("ready", START_PATIENCE).await?;
        let at = |k: &str| ready[k].as_f64().unwrap_or(f64::NAN);
        eprintln!(
            "    (its DispatchServer was built in {:.3} s)",
            at("wall") - at("construct_wall")
        );
        if o.lost != 0 {
            out.lost.push(format!("TF {kind}: {}", o.lost));
        }
        let into = if standby {
            &mut out.tf_standby
        } else {
            &mut out.tf_restart
        };
        into.push(o.seconds);
        current = next;
    }
    Ok(())
}

/// When a replica other than `killed` logged "serving as leader" after `after` (wall seconds),
/// in seconds since `after`. The logs' timestamps are UTC times of day.
pub(super) fn elected(cluster: &Cluster, killed: u64, after: f64) -> Option<f64> {
    let of_day = |line: &str| -> Option<f64> {
        let hms = line.split_whitespace().next()?.split('T').nth(1)?;
        let mut p = hms.trim_end_matches('Z').split(':').map(str::parse::<f64>);
        Some(p.next()?.ok()? * 3600.0 + p.next()?.ok()? * 60.0 + p.next()?.ok()?)
    };
    let since = |t: f64| (t - after % 86_400.0 + 86_400.0) % 86_400.0;
    let others = cluster.ids().into_iter().filter(|&id| id != killed);
    let logs: Vec<String> = others.map(|id| cluster.log(id)).collect();
    let served = logs
        .iter()
        .flat_map(|l| l.lines())
        .filter(|l| l.contains("serving as leader"));
    let since_kill = served.filter_map(of_day).map(since);
    since_kill.filter(|&s| s < 3_600.0).min_by(f64::total_cmp)
}

pub(super) async fn coord_outages(
    python: &Path,
    args: &Args,
    out: &mut Outages,
) -> Result<(), String> {
    let mut cluster = ensemble(args, DEFAULT_LOG_FILTER);
    let (_proxy, proxy_addr) = start_proxy(&cluster, args).await?;
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    // GetSplit straight to the leader, for the proxy's share of the round trip.
    let direct = cluster.replica(leader).grpc.to_string();
    let splits = Script::start(python, &["splits", "--dispatcher", &direct], "coord direct")?;
    splits.event("ready", START_PATIENCE).await?;
    for _ in 0..3 {
        out.coord_direct_p50.push(steady(&splits).await?);
    }
    drop(splits);
    let args_ = ["splits", "--dispatcher", &proxy_addr];
    let mut splits = Script::start(python, &args_, "coord fake worker")?;
    splits.event("ready", START_PATIENCE).await?;
    for _ in 0..args.kills {
        out.coord_p50.push(steady(&splits).await?);
        let leader = cluster.wait_for_leader(Duration::from_secs(30)).await;
        let killed_at = wall();
        cluster.kill(leader);
        let o = next_split(
            &mut splits,
            killed_at,
            &format!("coord, leader {leader} killed"),
        )
        .await?;
        let elected = elected(&cluster, leader, killed_at);
        let shown = elected.map_or("?".into(), |e| format!("{e:.3} s"));
        eprintln!("    (a new leader served {shown} after the kill)");
        if o.lost != 0 {
            out.lost.push(format!("coord: {}", o.lost));
        }
        out.coord.push(o.seconds);
        out.coord_elected.extend(elected);
        cluster.spawn(leader);
        let now = cluster.wait_for_leader(Duration::from_secs(60)).await;
        let index = cluster.status(now).map_or(0, |s| s.last_log_index);
        cluster
            .wait_applied(leader, index, Duration::from_secs(60))
            .await;
    }
    keep_if_asked(&mut cluster, args, "outage");
    Ok(())
}

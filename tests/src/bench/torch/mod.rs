//! `coord-bench torch`: torch's TCPStore served by coord-proxy over a 3-replica ensemble, against
//! torch's own store (the libuv server, from the venv's torch 2.15.0), in the same run.
//!
//! - **Calls**: the p50 latency of SET, GET, ADD, COMPARE_SET and a WAIT released by another
//!   client's SET, one call at a time on one connection, with the same client for both
//!   ([`calls`]).
//! - **init_process_group for N ranks**: the store traffic of N ranks starting at once (connect,
//!   master address, join counter, WAIT, GET), simulated on one runtime ([`init`]); the time
//!   until every rank is done. The systems alternate round after round; medians.
//! - **torchrun 1 × 2**: from torchrun's start to rank 0's first training step, its c10d
//!   rendezvous on either store (a store it does not host, `is_host=false`); medians.
//! - **Leader kill -9**: the longest call a real torch client (ADD back to back, one connection)
//!   sees while the leader is killed; median over kills ([`runs`]).
//!
//! `--init-only` runs the init_process_group rows alone. For 100,000 ranks, say: [`init`] spreads
//! them over loopback source addresses and, past what one process may hold (`ulimit -Hn`), over
//! child processes ([`ranks`]); `--sidecars K` puts K coord-proxies in front of the ensemble, a
//! block of ranks a sidecar as a job's hosts have theirs. torch's store is one process holding a
//! connection per rank: a round of more ranks than this host lets a process open is not run on it,
//! with the reason printed.
//!
//! Every process runs on this machine (two cores here): the ensemble, coord-proxy, torch's store
//! and the clients share them.

mod calls;
mod init;
pub mod ranks;
mod runs;

use std::time::Duration;

use crate::torch::{StoreSidecar, Torch};
use crate::{Cluster, ClusterOptions};

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Calls of each kind in the latency rows.
    #[arg(long, default_value_t = 2000)]
    pub samples: usize,
    /// Simulated ranks of the init_process_group rows (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [256, 4096])]
    pub ranks: Vec<usize>,
    /// Rounds of the init_process_group and torchrun rows (the systems alternate; medians).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Leader kills under a torch client.
    #[arg(long, default_value_t = 5)]
    pub kills: usize,
    /// How long one init_process_group round may take before it counts as not done.
    #[arg(long, default_value_t = 120)]
    pub init_timeout_secs: u64,
    /// Only the init_process_group rows: no call latencies, torchrun runs or leader kills.
    #[arg(long)]
    pub init_only: bool,
    /// coord-proxies serving the init_process_group rows' ranks, each a block of them (as each
    /// host's ranks are clients of its own sidecar); each must hold its block's connections.
    #[arg(long, default_value_t = 1)]
    pub sidecars: usize,
}

/// What the rows other than init_process_group's measured (not with `--init-only`).
struct Others {
    /// torchrun 1 × 2's start to its first step, median: torch's store, coord.
    first_step: (Duration, Duration),
    /// Per leader kill, the longest call the torch client saw.
    stalls: Vec<Duration>,
}

fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

fn ratio(coord: Duration, torch: Duration) -> String {
    if torch.is_zero() {
        return "–".into();
    }
    format!("{:.2}×", coord.as_secs_f64() / torch.as_secs_f64())
}

fn met(ok: bool) -> &'static str {
    if ok {
        "yes"
    } else {
        "**no**"
    }
}

/// Runs `coord-bench torch` and prints its tables.
pub async fn run(args: Args) -> Result<(), String> {
    init::raise_open_files_limit();
    let per_process = init::ranks_per_process();
    let sidecars = args.sidecars.max(1);
    if let Some(n) = args
        .ranks
        .iter()
        .find(|&&n| n.div_ceil(sidecars) > per_process)
    {
        return Err(format!(
            "{n} ranks over {sidecars} coord-proxies is up to {} connections a coord-proxy, over \
             the {per_process} a process may hold here: use --sidecars {} or more",
            n.div_ceil(sidecars),
            n.div_ceil(per_process)
        ));
    }
    let torch = Torch::get().map_err(|why| format!("coord-bench torch needs torch: {why}"))?;
    let own = runs::OwnStore::start(&torch)?;
    let mut cluster = Cluster::start(ClusterOptions {
        extra_args: vec!["--worker-threads".into(), "1".into()],
        log_filter: "warn".into(),
        ..ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    let proxies: Vec<StoreSidecar> = (0..sidecars)
        .map(|_| StoreSidecar::start(&cluster.endpoints()))
        .collect();
    let sidecar = &proxies[0];
    let targets = [
        ("torch", own.addr.as_str()),
        ("coord", sidecar.store.as_str()),
    ];
    eprintln!(
        "coord-bench torch: torch's store on {} (name lookups: {}), coord-proxy on {}",
        own.addr,
        own.lookups,
        proxies
            .iter()
            .map(|p| p.store.as_str())
            .collect::<Vec<_>>()
            .join(",")
    );
    let others = match args.init_only {
        true => None,
        false => Some(others(&args, &torch, &mut cluster, sidecar, &targets).await?),
    };

    // Last: init_process_group's store traffic, a burst of thousands of connections.
    let stores = [
        vec![own.addr.clone()],
        proxies.iter().map(|p| p.store.clone()).collect::<Vec<_>>(),
    ];
    let mut init_rows = Vec::new();
    for &n in &args.ranks {
        let mut times = [Vec::new(), Vec::new()];
        let limit = Duration::from_secs(args.init_timeout_secs);
        for round in 0..args.rounds {
            for (i, (name, _)) in targets.iter().enumerate() {
                // torch's store is one process with a descriptor per rank.
                if i == 0 && n > per_process {
                    eprintln!(
                        "  {n} ranks on torch's store, round {round}: not run (its one process \
                         would hold {n} connections; this host allows a process {per_process} \
                         beside its own)"
                    );
                    continue;
                }
                let ranks = init::Round {
                    stores: stores[i].clone(),
                    world: n,
                    tag: format!("init-{n}-{round}"),
                };
                // A round past the limit counts as the limit (the row then says "over").
                let took = match ranks::init_ranks(&ranks, limit).await {
                    Ok(took) => took,
                    Err(e) => {
                        eprintln!("  {n} ranks on {name}'s store, round {round}: {e}");
                        limit
                    }
                };
                eprintln!(
                    "  {n} ranks on {name}'s store, round {round}: {}",
                    secs(took)
                );
                times[i].push(took);
            }
        }
        let torch_time = (!times[0].is_empty()).then(|| median(&times[0]));
        init_rows.push((n, torch_time, median(&times[1]), limit));
    }

    let kills = match &others {
        Some(_) => format!("; kills: median of {}", args.kills),
        None => String::new(),
    };
    println!(
        "\n| torch on its store (median of {} rounds{kills}) | torch's store | coord | coord / torch | target | met |",
        args.rounds
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let through = match sidecars {
        1 => String::new(),
        k => format!(" (coord through {k} coord-proxies)"),
    };
    for (n, t, c, limit) in &init_rows {
        let shown = |d: &Duration| match d >= limit {
            true => format!("over {}", secs(*limit)),
            false => secs(*d),
        };
        let (target, ok, torch_shown, x) = match t {
            Some(t) => {
                let (target, ok) = match n {
                    4096 => (
                        "≤ 2×",
                        met(c.as_secs_f64() <= 2.0 * t.as_secs_f64() && c < limit),
                    ),
                    100_000 => (
                        "≤ 1.5×",
                        met(c.as_secs_f64() <= 1.5 * t.as_secs_f64() && c < limit),
                    ),
                    _ => ("", ""),
                };
                let x = match t >= limit {
                    true => format!("under {}", ratio(*c, *t)),
                    false => ratio(*c, *t),
                };
                (target, ok, shown(t), x)
            }
            None => (
                "",
                "",
                "not run: over a process's open files".into(),
                "–".into(),
            ),
        };
        println!(
            "| init_process_group's store traffic, {n} ranks at once{through}: all done | {torch_shown} | {} | {x} | {target} | {ok} |",
            shown(c),
        );
    }
    if let Some(Others { first_step, stalls }) = &others {
        let (first_t, first_c) = *first_step;
        let stall = median(stalls);
        let worst = stalls.iter().max().copied().unwrap_or_default();
        println!(
            "| torchrun 1 × 2, c10d: start to first step | {} | {} | {} | ≤ 1.2× | {} |",
            secs(first_t),
            secs(first_c),
            ratio(first_c, first_t),
            met(first_c.as_secs_f64() <= 1.2 * first_t.as_secs_f64())
        );
        println!(
            "| leader kill -9: longest call of a torch client (worst of {}: {}) | dies with its host | {} | | ≤ 1 s | {} |",
            stalls.len(),
            secs(worst),
            secs(stall),
            met(stall <= Duration::from_secs(1))
        );
    }
    println!("\ntorch's store's name lookups: {}.", own.lookups);
    Ok(())
}

/// The rows before init_process_group's: the call latencies (their table printed here), torchrun's
/// rendezvous to its first step, and the leader kills under a torch client.
async fn others(
    args: &Args,
    torch: &Torch,
    cluster: &mut Cluster,
    sidecar: &StoreSidecar,
    targets: &[(&str, &str); 2],
) -> Result<Others, String> {
    // Calls, one at a time.
    let mut lat = Vec::new();
    for (name, addr) in targets {
        eprintln!("  {} calls of each kind on {name}'s store", args.samples);
        lat.push(calls::measure(addr, args.samples, &format!("calls-{name}")).await?);
    }
    println!("\n| store call, one connection, one at a time | torch p50 | coord p50 | coord / torch | torch p99 | coord p99 |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, call) in calls::CALLS.iter().enumerate() {
        let (t, c) = (&lat[0][i], &lat[1][i]);
        let p = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q) as usize];
        println!(
            "| {call} | {} | {} | {} | {} | {} |",
            ms(p(t, 0.5)),
            ms(p(c, 0.5)),
            ratio(p(c, 0.5), p(t, 0.5)),
            ms(p(t, 0.99)),
            ms(p(c, 0.99)),
        );
    }

    // torchrun's rendezvous to its first step.
    let mut first = [Vec::new(), Vec::new()];
    for round in 0..args.rounds {
        for (i, (name, addr)) in targets.iter().enumerate() {
            let took = runs::first_step(torch, addr, &format!("first-{name}-{round}"))?;
            eprintln!(
                "  torchrun 1 × 2 on {name}'s store, round {round}: first step after {}",
                secs(took)
            );
            first[i].push(took);
        }
    }

    // Leader kills under a torch client.
    let stalls = runs::stalls(torch, cluster, &sidecar.store, args.kills).await?;
    Ok(Others {
        first_step: (median(&first[0]), median(&first[1])),
        stalls,
    })
}

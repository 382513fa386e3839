//! `coord-bench namespaces`: one ensemble serving many jobs at once, each in its own namespace,
//! and one noisy job writing as fast as it can beside them.
//!
//! Every quiet namespace holds a job of `--tasks` simulated tasks: they register, heartbeat once
//! a second, and in rounds each writes a key and then all meet at a barrier. The run measures the
//! barrier latency of the quiet namespaces alone, then again while the noisy namespace (with a
//! write rate limit) writes from many concurrent callers: the ratio of the two p99s is what a
//! noisy neighbour costs. It also reports how many of the noisy writes the ensemble took (held to
//! the noisy namespace's rate), and what an empty namespace costs in the state (the growth of a
//! backup of the whole state per namespace declared).
//!
//! Last, whether a namespace's memory comes back: `--memory-namespaces` namespaces are filled
//! with `--memory-mib` MiB of values each; half are deleted (`ns delete`), the other half left to
//! their TTL; then every replica snapshots (so its log no longer holds the writes) and each
//! replica's resident memory (VmRSS) and the state's bytes are compared before, full and after.
//! Twice: what the allocator keeps after the first cycle is reused by the second if nothing
//! leaks.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use coord_agent::{ClientOptions, CoordClient};
use coord_proto::coord::admin::{DeclareNamespaceRequest, NamespaceLimits, NamespaceShape};
use coord_proto::tensorflow as tf;
use futures::StreamExt;

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Quiet namespaces, each with one job.
    #[arg(long, default_value_t = 100)]
    pub namespaces: usize,
    /// Simulated tasks in each quiet namespace's job.
    #[arg(long, default_value_t = 16)]
    pub tasks: u32,
    /// Seconds of each measured phase (quiet alone, then with the noisy namespace).
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// The noisy namespace's write limit (writes_per_sec).
    #[arg(long, default_value_t = 200)]
    pub noisy_rate: u64,
    /// Concurrent writers in the noisy namespace.
    #[arg(long, default_value_t = 64)]
    pub noisy_writers: usize,
    /// Namespaces filled, then deleted or expired, to see memory come back.
    #[arg(long, default_value_t = 20)]
    pub memory_namespaces: usize,
    /// MiB of values in each of them.
    #[arg(long, default_value_t = 4)]
    pub memory_mib: usize,
}

fn client(endpoints: &[String], namespace: Option<String>) -> Result<CoordClient, String> {
    let mut o = ClientOptions::new(endpoints.to_vec());
    o.namespace = namespace;
    o.unavailable_after = Duration::from_secs(60);
    CoordClient::new(o).map_err(|e| e.to_string())
}

fn task(id: u32) -> tf::CoordinatedTask {
    tf::CoordinatedTask {
        job_name: "worker".into(),
        task_id: id as i32,
        recoverable: false,
    }
}

/// Bytes of a backup of the whole state (every namespace), as the leader encodes it.
async fn state_size(ops: &CoordClient) -> Result<u64, String> {
    let (_, file) = ops.backup().await.map_err(|e| e.to_string())?;
    Ok(file.len() as u64)
}

/// Failed calls: how many, and the first one's error.
#[derive(Default)]
struct Failures {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl Failures {
    fn record(&self, what: &str, e: &tonic::Status) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut first) = self.first.lock() {
            first.get_or_insert_with(|| format!("{what}: {e}"));
        }
    }
}

/// One quiet namespace's job: rounds of a key write and a barrier across its tasks, until
/// `stop`, numbered on from `next` (a barrier instance passes once); every barrier call's
/// latency goes to `latencies`, every failure to `errors`.
async fn quiet_job(
    cl: CoordClient,
    tasks: u32,
    next: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
    latencies: Arc<Mutex<Vec<Duration>>>,
    errors: Arc<Failures>,
) {
    while !stop.load(Ordering::Relaxed) {
        let round = next.fetch_add(1, Ordering::Relaxed);
        let calls = (0..tasks).map(|t| {
            let cl = cl.clone();
            async move {
                cl.insert(&format!("round/{t}"), Bytes::from(round.to_string()), true)
                    .await?;
                let started = Instant::now();
                cl.barrier("round", round, Duration::from_secs(60), &[], &task(t))
                    .await?;
                Ok::<Duration, tonic::Status>(started.elapsed())
            }
        });
        for r in futures::future::join_all(calls).await {
            match r {
                Ok(d) => latencies.lock().map(|mut l| l.push(d)).unwrap_or(()),
                Err(e) => errors.record("a round", &e),
            }
        }
    }
}

/// Every task of every quiet namespace heartbeats once a second until `stop`.
async fn heartbeats(
    clients: Vec<CoordClient>,
    tasks: u32,
    stop: Arc<AtomicBool>,
    errors: Arc<Failures>,
) {
    while !stop.load(Ordering::Relaxed) {
        let tick = Instant::now();
        let beats = clients
            .iter()
            .flat_map(|cl| (0..tasks).map(move |t| (cl.clone(), t)));
        futures::stream::iter(beats)
            .for_each_concurrent(256, |(cl, t)| {
                let errors = errors.clone();
                async move {
                    if let Err(e) = cl.heartbeat(&task(t), 1).await {
                        errors.record("a heartbeat", &e);
                    }
                }
            })
            .await;
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Runs the quiet jobs for `seconds`; their barrier latencies, sorted, and their failures.
async fn phase(
    quiet: &[(CoordClient, Arc<AtomicI64>)],
    args: &Args,
) -> (Vec<Duration>, Arc<Failures>) {
    let stop = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Failures::default());
    let mut jobs: Vec<_> = quiet
        .iter()
        .map(|(cl, next)| {
            tokio::spawn(quiet_job(
                cl.clone(),
                args.tasks,
                next.clone(),
                stop.clone(),
                latencies.clone(),
                errors.clone(),
            ))
        })
        .collect();
    jobs.push(tokio::spawn(heartbeats(
        quiet.iter().map(|(cl, _)| cl.clone()).collect(),
        args.tasks,
        stop.clone(),
        errors.clone(),
    )));
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for j in jobs {
        let _ = j.await;
    }
    let mut l = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort();
    (l, errors)
}

pub async fn run(args: Args) -> Result<(), String> {
    let mut cluster = crate::Cluster::start(crate::ClusterOptions {
        log_filter: "warn".into(),
        ..crate::ClusterOptions::default()
    });
    cluster.wait_for_leader(Duration::from_secs(60)).await;
    let endpoints = cluster.endpoints();
    let ops = client(&endpoints, None)?;
    let shape = NamespaceShape {
        jobs: [("worker".to_string(), args.tasks)].into_iter().collect(),
        heartbeat_timeout_ms: 30_000,
        ..NamespaceShape::default()
    };
    let before = state_size(&ops).await?;
    let mut quiet = Vec::new();
    for i in 0..args.namespaces {
        let name = format!("quiet-{i}");
        ops.declare_namespace(DeclareNamespaceRequest {
            name: name.clone(),
            shape: Some(shape.clone()),
            limits: None,
        })
        .await
        .map_err(|e| format!("declare {name}: {e}"))?;
        quiet.push((client(&endpoints, Some(name))?, Arc::new(AtomicI64::new(0))));
    }
    let declared = state_size(&ops).await?;
    for (cl, _) in &quiet {
        for t in 0..args.tasks {
            cl.register_task(&task(t), 1)
                .await
                .map_err(|e| format!("register: {e}"))?;
        }
    }
    let registered = state_size(&ops).await?;
    let noisy_limits = NamespaceLimits {
        writes_per_sec: args.noisy_rate,
        ..NamespaceLimits::default()
    };
    ops.declare_namespace(DeclareNamespaceRequest {
        name: "noisy".into(),
        shape: Some(NamespaceShape::default()),
        limits: Some(noisy_limits),
    })
    .await
    .map_err(|e| format!("declare noisy: {e}"))?;
    eprintln!(
        "coord-bench namespaces: {} namespaces x {} tasks; {} s alone, then {} s beside a noisy namespace limited to {} writes/s",
        args.namespaces, args.tasks, args.seconds, args.seconds, args.noisy_rate
    );

    let (alone, alone_errors) = phase(&quiet, &args).await;

    let noisy = client(&endpoints, Some("noisy".into()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (taken, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writers: Vec<_> = (0..args.noisy_writers)
        .map(|w| {
            let (cl, stop, taken, refused) =
                (noisy.clone(), stop.clone(), taken.clone(), refused.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w{w}/{}", i % 64);
                    match cl.insert(&key, Bytes::from(vec![b'n'; 256]), true).await {
                        Ok(()) => taken.fetch_add(1, Ordering::Relaxed),
                        Err(_) => refused.fetch_add(1, Ordering::Relaxed),
                    };
                    i += 1;
                }
            })
        })
        .collect();
    let noisy_started = Instant::now();
    let (beside, beside_errors) = phase(&quiet, &args).await;
    stop.store(true, Ordering::Relaxed);
    let noisy_secs = noisy_started.elapsed().as_secs_f64();
    for w in writers {
        let _ = w.await;
    }

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (p50a, p99a) = (percentile(&alone, 0.5), percentile(&alone, 0.99));
    let (p50b, p99b) = (percentile(&beside, 0.5), percentile(&beside, 0.99));
    let per_ns = |after: u64, from: u64| after.saturating_sub(from) as f64 / args.namespaces as f64;
    println!(
        "\n| measure ({} namespaces x {} tasks, 3 replicas) | value | target |",
        args.namespaces, args.tasks
    );
    println!("|---|---:|---:|");
    println!(
        "| quiet barrier p50 / p99, alone | {:.1} / {:.1} ms ({} barriers) | |",
        ms(p50a),
        ms(p99a),
        alone.len()
    );
    println!(
        "| quiet barrier p50 / p99, beside the noisy namespace | {:.1} / {:.1} ms ({} barriers) | |",
        ms(p50b),
        ms(p99b),
        beside.len()
    );
    println!(
        "| quiet p99 beside / alone | {:.2}x | <= 1.5x |",
        ms(p99b) / ms(p99a).max(1e-9)
    );
    let failed = |f: &Failures| f.count.load(Ordering::Relaxed);
    println!(
        "| quiet calls that failed (both phases) | {} | 0 |",
        failed(&alone_errors) + failed(&beside_errors)
    );
    let rate = taken.load(Ordering::Relaxed) as f64 / noisy_secs;
    println!(
        "| noisy writes taken | {:.0}/s ({} taken, {} refused) | <= {} /s + one burst |",
        rate,
        taken.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        args.noisy_rate
    );
    println!(
        "| state per declared namespace (backup growth) | {:.0} B | <= 4096 B |",
        per_ns(declared, before)
    );
    println!(
        "| ... with its {} tasks registered | {:.0} B | |",
        args.tasks,
        per_ns(registered, before)
    );
    for (phase, f) in [("alone", &alone_errors), ("beside", &beside_errors)] {
        if let Some(first) = f.first.lock().ok().and_then(|f| f.clone()) {
            println!("\nfirst quiet failure ({phase}): {first}");
        }
    }
    memory_back(&cluster, &ops, &args).await
}

/// Each replica's resident bytes, in the order of `cluster.ids()`, once mimalloc has had time to
/// give freed pages back.
async fn settled_rss(cluster: &crate::Cluster) -> Vec<u64> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    cluster
        .ids()
        .iter()
        .map(|&id| {
            cluster
                .pid(id)
                .and_then(super::tasks::rss_bytes)
                .unwrap_or(0)
        })
        .collect()
}

/// Every replica snapshots, so that its log holds none of what was written before.
async fn snapshot_all(cluster: &crate::Cluster, ops: &CoordClient) -> Result<(), String> {
    for i in 0..cluster.ids().len() {
        ops.snapshot_of(i)
            .await
            .map_err(|e| format!("snapshot of replica {i}: {e}"))?;
    }
    Ok(())
}

/// State bytes, and each replica's resident bytes.
type Measure = (u64, Vec<u64>);

/// One fill-and-free cycle's measures when full and after.
struct Cycle {
    full: Measure,
    after: Measure,
    /// From the first delete until the last namespace was gone (the TTL's included).
    freed: Duration,
}

/// Fills `--memory-namespaces` namespaces of cycle `cycle`, then deletes half and lets the TTL
/// take the rest.
async fn fill_and_free(
    cluster: &crate::Cluster,
    ops: &CoordClient,
    args: &Args,
    cycle: usize,
) -> Result<Cycle, String> {
    const VALUE: usize = 64 << 10;
    // Long enough that none expires before the full state is measured.
    const TTL_MS: u64 = 30_000;
    let endpoints = cluster.endpoints();
    let prefix = format!("memory-{cycle}-");
    let names: Vec<String> = (0..args.memory_namespaces)
        .map(|i| format!("{prefix}{i}"))
        .collect();
    for (i, name) in names.iter().enumerate() {
        // The odd ones are left to their TTL.
        let limits = (i % 2 == 1).then(|| NamespaceLimits {
            ttl_ms: TTL_MS,
            ..NamespaceLimits::default()
        });
        ops.declare_namespace(DeclareNamespaceRequest {
            name: name.clone(),
            shape: Some(NamespaceShape::default()),
            limits,
        })
        .await
        .map_err(|e| format!("declare {name}: {e}"))?;
        let cl = client(&endpoints, Some(name.clone()))?;
        for k in 0..(args.memory_mib << 20) / VALUE {
            cl.insert(&format!("v/{k}"), Bytes::from(vec![b'm'; VALUE]), true)
                .await
                .map_err(|e| format!("fill {name}: {e}"))?;
        }
    }
    snapshot_all(cluster, ops).await?;
    let full = (state_size(ops).await?, settled_rss(cluster).await);
    let left = |rows: Vec<coord_proto::coord::admin::NamespaceRow>| {
        rows.iter().filter(|r| r.name.starts_with(&prefix)).count()
    };
    let listed = left(ops.list_namespaces().await.map_err(|e| e.to_string())?);
    if listed != names.len() {
        return Err(format!(
            "{listed} of {} namespaces left when the full state was measured: raise the TTL",
            names.len()
        ));
    }
    let started = Instant::now();
    for name in names.iter().step_by(2) {
        ops.delete_namespace(name)
            .await
            .map_err(|e| format!("delete {name}: {e}"))?;
    }
    // The TTL counts from each one's last write; the leader looks once a second.
    let deadline = Instant::now() + Duration::from_millis(TTL_MS) + Duration::from_secs(60);
    loop {
        let n = left(ops.list_namespaces().await.map_err(|e| e.to_string())?);
        if n == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{n} namespaces outlived their {TTL_MS} ms TTL by a minute"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let freed = started.elapsed();
    snapshot_all(cluster, ops).await?;
    let after = (state_size(ops).await?, settled_rss(cluster).await);
    Ok(Cycle { full, after, freed })
}

/// Two cycles of filling namespaces and freeing them (half deleted, half expired), and each
/// replica's resident memory and the state's bytes before, full and after each: what a delete
/// gives back, and whether churn grows a replica.
async fn memory_back(
    cluster: &crate::Cluster,
    ops: &CoordClient,
    args: &Args,
) -> Result<(), String> {
    snapshot_all(cluster, ops).await?;
    let before = (state_size(ops).await?, settled_rss(cluster).await);
    let mut cycles = Vec::new();
    for cycle in 1..=2 {
        cycles.push(fill_and_free(cluster, ops, args, cycle).await?);
    }
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1 << 20) as f64);
    println!(
        "\n| memory: 2 cycles of {} namespaces x {} MiB filled, then half deleted, half expired by TTL | before | full 1 | after 1 | full 2 | after 2 |",
        args.memory_namespaces, args.memory_mib
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let row = |what: String, of: &dyn Fn(&Measure) -> u64| {
        let mut cells = vec![mib(of(&before))];
        for c in &cycles {
            cells.push(mib(of(&c.full)));
            cells.push(mib(of(&c.after)));
        }
        println!("| {what} | {} |", cells.join(" | "));
    };
    row("state (backup bytes)".into(), &|m| m.0);
    for (i, id) in cluster.ids().iter().enumerate() {
        row(format!("replica {id} resident (VmRSS)"), &|m| {
            m.1.get(i).copied().unwrap_or(0)
        });
    }
    for (i, c) in cycles.iter().enumerate() {
        println!(
            "\ncycle {}: every namespace gone {:.1} s after the first delete (TTL 30 s)",
            i + 1,
            c.freed.as_secs_f64()
        );
    }
    Ok(())
}

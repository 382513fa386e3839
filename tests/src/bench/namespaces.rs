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
    Ok(())
}

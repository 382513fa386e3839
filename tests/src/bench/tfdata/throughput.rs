//! Throughput: the same TF workers and reader against both dispatchers, round after round.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::cluster::free_ports;

use super::harness::{
    cpu_seconds, ensemble, keep_if_asked, metrics, start_proxy, Args, DYNAMIC, START_PATIENCE,
    WARMUP_ELEMENTS,
};
use super::script::{tf_dispatcher, Script};

/// One kind of timed read.
pub(super) struct Workload {
    pub(super) label: String,
    /// `range(n)`, each element a vector of `ints` int64s (1: a scalar).
    pub(super) n: u64,
    pub(super) ints: u64,
    /// [`DYNAMIC`] (one split per source element), or `parallel_epochs`: no dispatcher in the
    /// element path, every worker produces all of it (`copies` = W), the ceiling of what the
    /// workers and the reader deliver on this machine.
    pub(super) mode: &'static str,
    pub(super) copies: usize,
    /// Where the elements are batched by 256: "client" (after `distribute`: every element is its
    /// own GetElement call from the reader) or "workers" (before it: a worker asks for 256 splits
    /// per batch and the reader fetches whole batches, so the dispatcher's share of the work is
    /// the largest).
    pub(super) batch_on: &'static str,
    /// The target (≥ 2× TF) applies.
    pub(super) headline: bool,
}

impl Workload {
    pub(super) fn dynamic(
        label: String,
        n: u64,
        ints: u64,
        batch_on: &'static str,
        headline: bool,
    ) -> Workload {
        let (mode, copies) = (DYNAMIC, 1);
        Workload {
            label,
            n,
            ints,
            mode,
            copies,
            batch_on,
            headline,
        }
    }
}

pub(super) fn workloads(args: &Args, w: usize) -> Vec<Workload> {
    let n = args.elements;
    let label = format!("range({n}), one split per element, {w} workers");
    let mut all = vec![Workload::dynamic(label, n, 1, "client", true)];
    if args.batched_elements > 0 {
        let m = args.batched_elements;
        let label = format!("range({m}), one split per element, batched by 256 on the {w} workers");
        all.push(Workload::dynamic(label, m, 1, "workers", true));
    }
    if args.heavy_kib > 0 {
        let (kib, m) = (args.heavy_kib, args.heavy_elements);
        let label = format!("{kib} KiB elements, range({m}), one split each, {w} workers");
        all.push(Workload::dynamic(label, m, kib * 1024 / 8, "client", false));
    }
    let each = n / w as u64;
    all.push(Workload {
        label: format!("ceiling, no dispatcher per element: range({each}) from each of {w} workers (OFF sharding)"),
        n: each,
        ints: 1,
        mode: "parallel_epochs",
        copies: w,
        batch_on: "client",
        headline: false,
    });
    all
}

/// One timed read: elements/s.
pub(super) async fn read(
    reader: &mut Script,
    tag: &str,
    addr: &str,
    w: &Workload,
) -> Result<f64, String> {
    let (n, ints, mode, copies, on) = (w.n, w.ints, w.mode, w.copies, w.batch_on);
    reader.send(&format!(
        "read {tag} {addr} {n} {ints} {mode} {copies} {on}"
    ));
    let timeout = Duration::from_secs(120 + n * copies as u64 / 100);
    let pick = |e: &Value| (e["event"] == "read" && e["tag"] == tag).then(|| e.clone());
    let r = reader.wait(&format!("read {tag}"), timeout, pick).await?;
    match r["rate"].as_f64() {
        Some(rate) if r["ok"] == true => Ok(rate),
        _ => Err(format!(
            "read {tag} via {addr}: {} {}",
            r["code"], r["message"]
        )),
    }
}

/// One system under the throughput runs: where its reads go, which processes count as what in
/// the CPU accounting, and what it measured.
pub(super) struct System {
    pub(super) name: &'static str,
    pub(super) address: String,
    pub(super) roles: Vec<(&'static str, Vec<u32>)>,
    /// Per workload: CPU seconds per role, and elements, over its timed reads.
    pub(super) cpu: Vec<Vec<f64>>,
    pub(super) elements: Vec<f64>,
    /// Per workload: seconds of its timed reads (elements over elements/s).
    pub(super) seconds: Vec<f64>,
    /// Elements/s of each round, per workload.
    pub(super) rates: Vec<Vec<f64>>,
}

/// The roles that are TensorFlow's own processes, whichever dispatcher they use.
const TF_ROLES: [&str; 2] = ["workers", "reader"];

impl System {
    pub(super) fn new(
        name: &'static str,
        address: String,
        roles: Vec<(&'static str, Vec<u32>)>,
        workloads: usize,
    ) -> Self {
        let cpu = vec![vec![0.0; roles.len()]; workloads];
        let (elements, seconds) = (vec![0.0; workloads], vec![0.0; workloads]);
        let rates = vec![Vec::new(); workloads];
        System {
            name,
            address,
            roles,
            cpu,
            elements,
            seconds,
            rates,
        }
    }

    pub(super) fn cpu_now(&self) -> Vec<f64> {
        let role = |pids: &Vec<u32>| pids.iter().map(|&p| cpu_seconds(p)).sum();
        self.roles.iter().map(|(_, pids)| role(pids)).collect()
    }

    /// CPU per element of workload `k`, in all and per role.
    pub(super) fn cpu_report(&self, k: usize) -> String {
        let per = |c: f64| 1e6 * c / self.elements[k].max(1.0);
        let roles: Vec<String> = (self.roles.iter().zip(&self.cpu[k]))
            .map(|((role, _), &c)| format!("{role} {:.0}", per(c)))
            .collect();
        let total = per(self.cpu[k].iter().sum());
        format!(
            "{}: {total:.0} ({}); {:.2} cores busy",
            self.name,
            roles.join(", "),
            self.cores(k)
        )
    }

    /// The cores workload `k`'s reads kept busy: CPU seconds over the reads' seconds.
    fn cores(&self, k: usize) -> f64 {
        self.cpu[k].iter().sum::<f64>() / self.seconds[k].max(1e-9)
    }

    /// The elements/s of workload `k` had this system's dispatcher path cost no CPU at all: the
    /// same cores busy, all of them spent by TensorFlow's workers and reader at the CPU per
    /// element they spent here. Meaningful while the reads were CPU-bound (cores near the
    /// machine's); a bound on what any dispatcher could do on this machine.
    pub(super) fn free_dispatcher_rate(&self, k: usize) -> f64 {
        let tf_only = (self.roles.iter().zip(&self.cpu[k]))
            .filter(|((role, _), _)| TF_ROLES.contains(role))
            .map(|(_, &c)| c)
            .sum::<f64>();
        self.cores(k) * self.elements[k] / tf_only.max(1e-9)
    }
}

/// A row of the throughput table: each round's elements/s on coord and on TF.
pub(super) struct Row {
    pub(super) label: String,
    pub(super) headline: bool,
    pub(super) coord: Vec<f64>,
    pub(super) tf: Vec<f64>,
    /// DYNAMIC rows: coord's elements/s had its dispatcher path cost nothing (see
    /// [`System::free_dispatcher_rate`]).
    pub(super) free_dispatcher: Option<f64>,
}

/// The throughput rows of `w` workers, one per workload.
pub(super) async fn throughput(python: &Path, args: &Args, w: usize) -> Result<Vec<Row>, String> {
    let work_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let dispatcher = tf_dispatcher(python, free_ports(1)[0], work_dir.path(), false)?;
    let mut cluster = ensemble(args, &args.log);
    let (proxy, proxy_addr) = start_proxy(&cluster, args).await?;
    let mut reader = Script::start(python, &["reader"], "reader")?;
    let ready = dispatcher.event("ready", START_PATIENCE).await?;
    let tf_addr = ready["address"].as_str().unwrap_or_default().to_string();
    let leader = cluster.wait_for_leader(Duration::from_secs(60)).await;
    let procs = args.worker_procs.clamp(1, w);
    let mut hosts = Vec::new();
    for i in 0..procs {
        let count = w / procs + usize::from(i < w % procs);
        let hb = args.heartbeat_ms;
        let a = format!(
            "workers --dispatchers {tf_addr},{proxy_addr} --count {count} --heartbeat-ms {hb}"
        );
        let a: Vec<&str> = a.split(' ').collect();
        hosts.push(Script::start(python, &a, &format!("worker host {i}"))?);
    }
    for h in &hosts {
        h.event("ready", START_PATIENCE).await?;
    }
    reader.event("imported", START_PATIENCE).await?;
    eprintln!("  {w} workers per system in {procs} processes; warming up");
    let hosts_pids: Vec<u32> = hosts.iter().map(Script::pid).collect();
    let followers = cluster.ids().into_iter().filter(|&id| id != leader);
    let followers = followers.filter_map(|id| cluster.pid(id)).collect();
    let workloads = workloads(args, w);
    let mut systems = [
        System::new(
            "coord",
            proxy_addr,
            vec![
                ("leader", cluster.pid(leader).into_iter().collect()),
                ("followers", followers),
                ("coord-proxy", vec![proxy.child.id()]),
                ("workers", hosts_pids.clone()),
                ("reader", vec![reader.pid()]),
            ],
            workloads.len(),
        ),
        System::new(
            "TF",
            tf_addr,
            vec![
                ("dispatcher", vec![dispatcher.pid()]),
                ("workers", hosts_pids),
                ("reader", vec![reader.pid()]),
            ],
            workloads.len(),
        ),
    ];
    let warmup = Workload::dynamic(String::new(), WARMUP_ELEMENTS, 1, "client", false);
    for s in &systems {
        let tag = format!("warmup-{}-{w}", s.name);
        read(&mut reader, &tag, &s.address, &warmup).await?;
    }
    let mut leader_during = vec![BTreeMap::<String, f64>::new(); workloads.len()];
    for round in 0..args.rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for (k, work) in workloads.iter().enumerate() {
            for &s in &order {
                let sys = &mut systems[s];
                let (cpu_before, m_before) = (sys.cpu_now(), metrics(&cluster, leader));
                let tag = format!("{}-{w}-{k}-{round}", sys.name);
                let r = read(&mut reader, &tag, &sys.address, work).await?;
                eprintln!(
                    "  round {round}: {:5} {}: {r:.0} elements/s",
                    sys.name, work.label
                );
                sys.rates[k].push(r);
                let cpu = sys.cpu_now().into_iter().zip(cpu_before);
                sys.cpu[k]
                    .iter_mut()
                    .zip(cpu)
                    .for_each(|(t, (a, b))| *t += a - b);
                let elements = (work.n * work.copies as u64) as f64;
                sys.elements[k] += elements;
                sys.seconds[k] += elements / r.max(1e-9);
                for (key, v) in metrics(&cluster, leader).into_iter().filter(|_| s == 0) {
                    let d = v - m_before.get(&key).copied().unwrap_or(0.0);
                    *leader_during[k].entry(key).or_default() += d;
                }
            }
        }
    }
    for (k, work) in workloads
        .iter()
        .enumerate()
        .filter(|(_, w)| w.mode == DYNAMIC)
    {
        eprintln!("  CPU per element (µs), {}, all rounds:", work.label);
        for s in &systems {
            eprintln!("    {}", s.cpu_report(k));
        }
        log_leader(&leader_during[k]);
    }
    keep_if_asked(&mut cluster, args, &format!("throughput, {w} workers"));
    drop((hosts, reader, proxy, dispatcher));
    let [coord, tf] = systems;
    let free: Vec<Option<f64>> = (workloads.iter().enumerate())
        .map(|(k, w)| (w.mode == DYNAMIC).then(|| coord.free_dispatcher_rate(k)))
        .collect();
    let rates = coord.rates.into_iter().zip(tf.rates).zip(free);
    let rows = workloads
        .into_iter()
        .zip(rates)
        .map(|(w, ((coord, tf), free_dispatcher))| Row {
            label: w.label,
            headline: w.headline,
            coord,
            tf,
            free_dispatcher,
        });
    Ok(rows.collect())
}

/// What coord's leader did during the timed reads of one workload (the differences of its `/metrics`
/// series over them).
pub(super) fn log_leader(during: &BTreeMap<String, f64>) {
    let d = |k: &str| during.get(k).copied().unwrap_or(0.0);
    let mean_ms =
        |series: &str| 1e3 * d(&format!("{series}_sum")) / d(&format!("{series}_count")).max(1.0);
    // coord-proxy's leases arrive as GetSplits; TF's own GetSplit straight to a replica.
    let rpc = |method: &str, part: &str| {
        d(&format!(
            "coord_rpc_duration_seconds_{part}{{method=\"tfdata/{method}\",code=\"OK\"}}"
        ))
    };
    let calls = rpc("GetSplits", "count") + rpc("GetSplit", "count");
    let seconds = rpc("GetSplits", "sum") + rpc("GetSplit", "sum");
    let syncs = d("coord_log_syncs_total");
    eprintln!(
        "  coord's leader meanwhile: {calls:.0} split requests (leases of coord-proxy), {:.2} ms \
         each (mean) from arrival to answer, of which the commit {:.2} ms (mean); {:.2} writes \
         per Raft entry; {syncs:.0} log syncs of {:.2} ms (mean)",
        1e3 * seconds / calls.max(1.0),
        mean_ms("coord_commit_latency_seconds"),
        d("coord_proposal_commands_total") / d("coord_proposal_entries_total").max(1.0),
        1e3 * d("coord_log_sync_seconds_sum") / syncs.max(1.0),
    );
}

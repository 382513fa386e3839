//! What a run of `coord-bench kv` measures: its flags ([`Args`]), the workloads they select, and
//! the labels of the systems measured. A leaf the rest of the benchmark reads.

use crate::bench::load::OpKind;

#[derive(clap::Args, Clone)]
pub struct Args {
    /// Operations per workload and round (the 1-client put runs a tenth of it).
    #[arg(long, default_value_t = 30_000)]
    pub ops: usize,
    /// Rounds per workload; coord and etcd alternate, and medians are reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Connections the clients share (capped at the number of clients).
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Leader kills for the write-gap measurement (0 skips it).
    #[arg(long, default_value_t = 5)]
    pub kills: usize,
    /// Writers during the leader kills.
    #[arg(long, default_value_t = 16)]
    pub failover_clients: usize,
    /// Only benchmark coord (starts neither etcd cluster, plain or TLS).
    #[arg(long)]
    pub skip_etcd: bool,
    /// Do not apt-get install etcd-server when etcd is missing.
    #[arg(long)]
    pub no_install: bool,
    /// Run only these workloads (put1, put256, get64); all by default.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Benchmark an already running coord ensemble at these gRPC addresses (comma separated)
    /// instead of starting one; leader kills are skipped.
    #[arg(long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Extra flags for every coord replica (e.g. --coord-arg=--election-timeout-min-ms=200).
    #[arg(long = "coord-arg")]
    pub coord_args: Vec<String>,
    /// Also run every workload on a second coord ensemble serving TLS (clients presenting an
    /// operator's certificate) and on a second etcd cluster serving mutual TLS (client and peer
    /// ports), in the same rounds, and report TLS against plain gRPC and against etcd over TLS.
    #[arg(long)]
    pub tls: bool,
    /// Also run every workload on a second coord ensemble keeping its Raft log in sled
    /// (`--raft-log sled`; the first one runs `--raft-log segments`), in the same rounds, and
    /// report it against the segment log and etcd, with each system's data directories' size
    /// after the load rounds.
    #[arg(long)]
    pub sled: bool,
}

/// One workload: what, how many clients, how many operations.
#[derive(Clone, Copy)]
pub(super) struct Workload {
    pub(super) key: &'static str,
    pub(super) name: &'static str,
    pub(super) kind: OpKind,
    pub(super) clients: usize,
    pub(super) ops: usize,
    /// The target coord/etcd throughput ratio from the issue.
    pub(super) target_ratio: f64,
    /// The target throughput ratio of coord over TLS to etcd over TLS (issue 26).
    pub(super) tls_target_ratio: f64,
}

/// The target throughput of coord over TLS against coord over plain gRPC (issue 26), every
/// workload alike.
pub(super) const TLS_PLAIN_TARGET: f64 = 0.85;

pub(super) fn workloads(args: &Args) -> Vec<Workload> {
    vec![
        Workload {
            key: "put1",
            name: "put, 1 client",
            kind: OpKind::Put,
            clients: 1,
            ops: (args.ops / 10).max(100),
            target_ratio: 1.0,
            tls_target_ratio: 1.2,
        },
        Workload {
            key: "put256",
            name: "put, 256 clients",
            kind: OpKind::Put,
            clients: 256,
            ops: args.ops,
            target_ratio: 1.5,
            tls_target_ratio: 1.5,
        },
        Workload {
            key: "get64",
            name: "linearizable get, 64 clients",
            kind: OpKind::Get,
            clients: 64,
            ops: args.ops,
            target_ratio: 3.0,
            tls_target_ratio: 3.0,
        },
    ]
    .into_iter()
    .filter(|w| args.only.is_empty() || args.only.iter().any(|o| o == w.key))
    .collect()
}

/// Labels of the systems measured in the rounds: the first coord ensemble (the segment log), its
/// second ensembles (`--tls`, `--sled`), and the etcd clusters (plain; mutual TLS with `--tls`).
pub(super) const COORD: &str = "coord";
pub(super) const TLS: &str = "tls";
pub(super) const SLED: &str = "sled";
pub(super) const ETCD: &str = "etcd";
pub(super) const ETCD_TLS: &str = "etcd-tls";

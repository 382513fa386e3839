//! The data directories each system left on disk after the load rounds (`--sled`'s last table):
//! coord's from its replicas' directories, etcd's from its members' command lines.

use std::path::PathBuf;

use super::plan::{COORD, ETCD, SLED};
use super::systems::CoordSystem;
use crate::bench::etcd::EtcdCluster;
use crate::bench::{disk_usage, mb, DiskUsage};

/// One system's data directories after the load rounds, all replicas (members) together: in
/// all, and its log's share (coord: `raft/`; etcd: `member/wal`). `None` where they were not
/// found.
pub(super) struct DataSize {
    label: &'static str,
    total: Option<DiskUsage>,
    log: Option<DiskUsage>,
}

/// The data directories of the segment ensemble, the sled ensemble and plain etcd.
pub(super) fn data_sizes(
    coords: &[CoordSystem],
    etcds: &[(&'static str, EtcdCluster)],
) -> Vec<DataSize> {
    let mut sizes = Vec::new();
    for s in coords
        .iter()
        .filter(|s| s.label == COORD || s.label == SLED)
    {
        let dirs: Vec<PathBuf> = s.cluster.as_ref().map_or(Vec::new(), |c| {
            c.ids()
                .iter()
                .map(|&id| c.replica(id).data_dir.clone())
                .collect()
        });
        sizes.push(DataSize {
            label: s.label,
            total: (!dirs.is_empty()).then(|| dirs.iter().map(|d| disk_usage(d)).sum()),
            log: (!dirs.is_empty()).then(|| dirs.iter().map(|d| disk_usage(&d.join("raft"))).sum()),
        });
    }
    let etcd = etcds
        .iter()
        .find(|(l, _)| *l == ETCD)
        .map(|(_, c)| c.endpoints());
    let dirs = etcd.as_deref().map_or(Vec::new(), etcd_data_dirs);
    if let Some(eps) = &etcd {
        if dirs.len() != eps.len() {
            eprintln!(
                "etcd: found the data directories of {} of {} members",
                dirs.len(),
                eps.len()
            );
        }
    }
    let found = etcd.is_some_and(|eps| dirs.len() == eps.len());
    sizes.push(DataSize {
        label: ETCD,
        total: found.then(|| dirs.iter().map(|d| disk_usage(d)).sum()),
        log: found.then(|| {
            dirs.iter()
                .map(|d| disk_usage(&d.join("member").join("wal")))
                .sum()
        }),
    });
    for s in &sizes {
        if let (Some(t), Some(l)) = (s.total, s.log) {
            eprintln!(
                "{:8} data directories: {} on disk ({} apparent), log {} on disk ({} apparent)",
                s.label,
                mb(t.on_disk),
                mb(t.apparent),
                mb(l.on_disk),
                mb(l.apparent)
            );
        }
    }
    sizes
}

/// The data directories of the etcd members listening on `endpoints` (`127.0.0.1:port`), read
/// from their command lines in `/proc`: [`EtcdCluster`] keeps its members' paths to itself.
pub(super) fn etcd_data_dirs(endpoints: &[String]) -> Vec<PathBuf> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for p in procs.flatten() {
        let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let value = |flag: &str| {
            let i = argv.iter().position(|a| a == flag)?;
            argv.get(i + 1)
        };
        let (Some(listen), Some(dir)) = (value("--listen-client-urls"), value("--data-dir")) else {
            continue;
        };
        if endpoints
            .iter()
            .any(|ep| listen.ends_with(&format!("://{ep}")))
        {
            dirs.push(PathBuf::from(dir));
        }
    }
    dirs
}

/// The data-directory table of `--sled`.
pub(super) fn print_sizes(sizes: &[DataSize]) {
    let cell = |label: &str, f: fn(&DataSize) -> Option<DiskUsage>| {
        sizes
            .iter()
            .find(|s| s.label == label)
            .and_then(f)
            .map_or("-".to_string(), |u| mb(u.on_disk))
    };
    println!("\n| data directories after the load rounds, 3 replicas together (du) | segments | sled | etcd |");
    println!("|---|---:|---:|---:|");
    for (row, f) in [
        (
            "in all",
            (|s: &DataSize| s.total) as fn(&DataSize) -> Option<DiskUsage>,
        ),
        ("the log (coord: raft/; etcd: member/wal)", |s| s.log),
    ] {
        println!(
            "| {row} | {} | {} | {} |",
            cell(COORD, f),
            cell(SLED, f),
            cell(ETCD, f)
        );
    }
}

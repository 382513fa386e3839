//! The standard `process_*` metrics of a Prometheus client (CPU, memory, file descriptors, start
//! time), read from `/proc/self` when `/metrics` is scraped. Where `/proc` is missing (not Linux)
//! they are left out rather than reported as zero.

use crate::ops::metrics::{counter_f64, gauge};

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux ABI).
const TICKS_PER_SECOND: f64 = 100.0;
/// The page size of `/proc/<pid>/statm`'s counts (4 KiB on the platforms coord is built for).
const PAGE_BYTES: f64 = 4096.0;

/// Appends the process metrics to `out`.
pub fn render(out: &mut String) {
    if let Some(stat) = read_stat() {
        counter_f64(
            out,
            "process_cpu_seconds_total",
            "Total user and system CPU time spent in seconds.",
            (stat.utime + stat.stime) as f64 / TICKS_PER_SECOND,
        );
        if let Some(boot) = boot_time() {
            gauge(
                out,
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                boot + stat.start_ticks as f64 / TICKS_PER_SECOND,
            );
        }
        gauge(
            out,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.vsize as f64,
        );
        gauge(
            out,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            stat.rss_pages as f64 * PAGE_BYTES,
        );
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        gauge(
            out,
            "process_open_fds",
            "Number of open file descriptors.",
            fds.count() as f64,
        );
    }
    if let Some(max) = max_fds() {
        gauge(
            out,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            max,
        );
    }
}

struct Stat {
    utime: u64,
    stime: u64,
    start_ticks: u64,
    vsize: u64,
    rss_pages: u64,
}

fn read_stat() -> Option<Stat> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// The fields of a `/proc/<pid>/stat` line: after the command name (in parentheses, and which
/// may itself hold spaces and parentheses), field 3 onwards, space separated.
fn parse_stat(line: &str) -> Option<Stat> {
    let rest = &line[line.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state): field n is `fields[n - 3]`.
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        start_ticks: field(22)?,
        vsize: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The machine's boot time (`btime` of `/proc/stat`), seconds since the epoch.
fn boot_time() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// The soft limit on open files (`/proc/self/limits`).
fn max_fds() -> Option<f64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_parsed_past_odd_command_names() {
        let line = "4242 (coord (a) b) S 1 4242 4242 0 -1 4194560 900 0 0 0 150 25 0 0 20 0 9 0 \
                    123456 1412192000 7800 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0";
        let s = parse_stat(line).expect("parsed");
        assert_eq!((s.utime, s.stime), (150, 25));
        assert_eq!(s.start_ticks, 123_456);
        assert_eq!(s.vsize, 1_412_192_000);
        assert_eq!(s.rss_pages, 7800);
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S 1 2").is_none());
    }

    /// On Linux this process's own metrics are all there, and plausible.
    #[test]
    fn this_process_is_measured() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            eprintln!("skipped: no /proc");
            return;
        }
        let mut out = String::new();
        render(&mut out);
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                out.contains(&format!("\n{name} ")),
                "{name} missing:\n{out}"
            );
        }
    }
}

//! The kernel's connection tracker, for benches that open connections by the hundred thousand.
//!
//! Where netfilter's conntrack is loaded (Docker's rules load it on this machine) every TCP
//! connection, loopback ones included, takes an entry in one table (`nf_conntrack_max`, 262,144
//! here), and a closed connection keeps its entry for `nf_conntrack_tcp_timeout_time_wait` (120 s).
//! A full table drops new connections' SYNs ("nf_conntrack: table full, dropping packet" in the
//! kernel's log), which the client sends again 1, 3, 7, … 63 s later: a 100,000-rank round that
//! starts within two minutes of an earlier one took 145–151 s instead of 14 s. So a round first
//! waits until the table has room for its connections, and says how many packets the tracker
//! dropped while it ran.

use std::time::{Duration, Instant};

const COUNT: &str = "/proc/sys/net/netfilter/nf_conntrack_count";
const MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";
const STATS: &str = "/proc/net/stat/nf_conntrack";

/// Entries kept free beyond a round's own connections (its stores' links, other processes').
const SPARE: u64 = 5_000;

fn read_number(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Entries in use and the table's size; `None` where connections are not tracked.
fn usage() -> Option<(u64, u64)> {
    Some((read_number(COUNT)?, read_number(MAX)?))
}

/// Packets the tracker has dropped since boot, summed over the CPUs' rows of `stats` (the text
/// of `/proc/net/stat/nf_conntrack`: a header naming the columns, then one row of hexadecimal
/// counters a CPU).
fn dropped_in(stats: &str) -> Option<u64> {
    let mut lines = stats.lines();
    let column = lines.next()?.split_whitespace().position(|c| c == "drop")?;
    lines
        .map(|row| {
            let field = row.split_whitespace().nth(column)?;
            u64::from_str_radix(field, 16).ok()
        })
        .sum()
}

/// Packets the tracker has dropped since boot; `None` where connections are not tracked.
pub fn dropped() -> Option<u64> {
    dropped_in(&std::fs::read_to_string(STATS).ok()?)
}

/// Waits, up to `within`, until the table has room for `connections` more, and says on stderr
/// how that went. A table too small for them, or still full at the deadline, is said too and the
/// round runs anyway (its SYNs may then be dropped).
pub async fn wait_for_room(connections: usize, within: Duration) {
    let need = connections as u64 + SPARE;
    let Some((count, max)) = usage() else {
        return;
    };
    if count + need <= max {
        return;
    }
    if need > max {
        eprintln!(
            "    the connection tracker holds {max} connections, fewer than this round's {connections}: \
             its SYNs past that are dropped"
        );
        return;
    }
    eprintln!(
        "    waiting for the connection tracker to have room for {connections} connections \
         ({count} of {max} in use: earlier connections' entries last 120 s after they close)"
    );
    let start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let waited = start.elapsed();
        match usage() {
            Some((count, max)) if count + need > max && waited < within => {}
            Some((count, max)) if count + need > max => {
                eprintln!(
                    "    the connection tracker still has {count} of {max} in use after {within:?}: \
                     running the round anyway"
                );
                return;
            }
            _ => {
                eprintln!(
                    "    the connection tracker had room after {:.1} s",
                    waited.as_secs_f64()
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_summed_over_the_cpus_rows() {
        // As read on this machine, two CPUs.
        let stats = "entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n\
            0003a9ff  00000000 00000000 00000000 0008e40f 00000000 00000000 00000000 00000000 00000000 000b7e2c 00007a48 00000000  00000000 00000000 00000000 00000000\n\
            0003a9ff  00000000 00000000 00000000 00095994 00000000 00000000 00000000 00000000 00000000 000e2781 00009e41 00000000  00000000 00000000 00000000 00000000\n";
        assert_eq!(dropped_in(stats), Some(0xb7e2c + 0xe2781));
        assert_eq!(dropped_in("entries found\n1 2\n"), None, "no drop column");
        assert_eq!(dropped_in("entries drop\n1 zz\n"), None, "not hexadecimal");
        assert_eq!(dropped_in("entries drop\n"), Some(0), "no CPU rows");
    }
}

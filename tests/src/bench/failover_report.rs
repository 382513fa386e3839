//! How a leader-kill measurement is printed, the same for every target and benchmark.

use super::failover::{self, Gap};

/// Logs each kill's worst client write gap and their median, for target `name`.
pub fn print_gaps(name: &str, gaps: &[Gap]) {
    let each: Vec<String> = gaps
        .iter()
        .map(|g| {
            let stuck = if g.stuck_clients > 0 {
                format!(" ({} clients stuck)", g.stuck_clients)
            } else {
                String::new()
            };
            format!("{} ms{stuck}", g.worst_gap.as_millis())
        })
        .collect();
    eprintln!(
        "{name:5} leader kill: worst client write gap median {} ms; each kill: {}",
        failover::median(gaps).as_millis(),
        each.join(", ")
    );
}

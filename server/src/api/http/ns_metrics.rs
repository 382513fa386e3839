//! `/metrics` per namespace, with bounded cardinality: the default namespace and the
//! [`TOP`] named ones holding the most bytes get series of their own, and every other named
//! namespace is summed under `namespace="_other"` (a name no namespace can have), so totals still
//! add up. One series per namespace would not do for a platform: jobs come and go by the
//! thousand, and each would leave its series behind in Prometheus. Any namespace's own usage is
//! in `coordctl ns list`.

use std::fmt::Write;

use coord_raft_store::state::{Space, TaskState};
use coord_raft_store::storage::StateReader;

use crate::ops::metrics::{gauge, header};
use crate::serve::namespace;
use crate::serve::parked::ParkBudget;

/// Named namespaces with series of their own.
pub const TOP: usize = 10;

/// One metric: its name, its help, and what it reads of a row.
type Series = (&'static str, &'static str, fn(&Usage) -> u64);

/// What one row of series says.
struct Usage {
    name: String,
    bytes: u64,
    keys: u64,
    connected: u64,
    parked: u64,
}

impl Usage {
    fn of(name: &str, space: &Space, parked: usize) -> Self {
        Usage {
            name: name.to_string(),
            bytes: space.usage(),
            keys: space.key_count(),
            connected: space
                .cluster
                .as_ref()
                .map_or(0, |c| c.tasks.count_in(TaskState::Connected) as u64),
            parked: parked as u64,
        }
    }

    fn add(&mut self, other: &Usage) {
        self.bytes += other.bytes;
        self.keys += other.keys;
        self.connected += other.connected;
        self.parked += other.parked;
    }
}

pub fn write(out: &mut String, reader: &StateReader, budget: &ParkBudget) {
    // The default namespace first.
    let mut rows: Vec<Usage> = reader.read(|a| {
        namespace::spaces(a)
            .map(|(ns, space)| Usage::of(namespace::shown(&ns), space, budget.used_in(&ns)))
            .collect()
    });
    let count = rows.len() - 1;
    gauge(
        out,
        "coord_namespaces",
        "Named namespaces (the default one not counted).",
        count as f64,
    );
    let default = rows.remove(0);
    rows.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    let mut shown = vec![default];
    let rest = rows.split_off(rows.len().min(TOP));
    shown.extend(rows);
    if !rest.is_empty() {
        let mut other = Usage {
            name: "_other".into(),
            bytes: 0,
            keys: 0,
            connected: 0,
            parked: 0,
        };
        for r in &rest {
            other.add(r);
        }
        shown.push(other);
    }
    let series: [Series; 4] = [
        ("coord_namespace_bytes", "State bytes of a namespace (the default one, the 10 largest named ones, and the rest summed as _other).", |u| u.bytes),
        ("coord_namespace_keys", "Keys of a namespace, path and raw (same rows).", |u| u.keys),
        ("coord_namespace_connected_tasks", "Connected tasks of a namespace's job (same rows).", |u| u.connected),
        ("coord_namespace_parked", "Calls and watches of a namespace parked on this replica (same rows).", |u| u.parked),
    ];
    for (name, help, value) in series {
        header(out, name, "gauge", help);
        for u in &shown {
            let _ = writeln!(out, "{name}{{namespace=\"{}\"}} {}", u.name, value(u));
        }
    }
}

//! The walk from the dataset root to its sources, as `DatasetBase::MakeSplitProviders` walks the
//! live datasets (framework/dataset.cc): a unary dataset delegates to its input, a multi-input one
//! that overrides it concatenates its inputs' providers, a source makes its own. Each source's
//! provider is built here from the node's inputs, with the checks TF's kernels make when they
//! build the dataset (a refusal where TF's `MakeDataset` fails).

use super::glob::Glob;
use super::graph::Graph;
use super::ops::{role, Role};
use super::refusal::Refusal;
use super::source::{range_count, SplitSource};
use super::tensor::{evaluate, Value};
use crate::tensorflow::attr_value;
use crate::tensorflow::NodeDef;

/// Bounds that keep a hostile graph cheap (a cycle of unary datasets, a lattice of zips that
/// doubles at every level). TF has none; no real pipeline comes near them.
const MAX_VISITS: usize = 100_000;
const MAX_DEPTH: usize = 256;
const MAX_PROVIDERS: usize = 4_096;

pub(super) struct Walk<'a, 'g> {
    graph: &'a Graph<'g>,
    glob: Glob<'a>,
    visits: usize,
    providers: Vec<SplitSource>,
}

impl<'a, 'g> Walk<'a, 'g> {
    pub fn new(graph: &'a Graph<'g>, glob: Glob<'a>) -> Self {
        Walk {
            graph,
            glob,
            visits: 0,
            providers: Vec::new(),
        }
    }

    /// The providers of the dataset `root`, in `split_provider_index` order.
    pub fn providers_of(mut self, root: &'g NodeDef) -> Result<Vec<SplitSource>, Refusal> {
        self.walk(root, 0)?;
        Ok(self.providers)
    }

    fn walk(&mut self, start: &'g NodeDef, depth: usize) -> Result<(), Refusal> {
        if depth > MAX_DEPTH {
            return Err(refuse(
                start,
                format!("datasets nest more than {MAX_DEPTH} deep"),
            ));
        }
        let mut node = start;
        loop {
            self.visits += 1;
            if self.visits > MAX_VISITS {
                return Err(refuse(
                    node,
                    format!("the walk passed {MAX_VISITS} nodes: a cycle, or a huge graph"),
                ));
            }
            let source = match role(&node.op) {
                Role::Unary => {
                    node = self.graph.first_input(node)?;
                    continue;
                }
                Role::AllInputs => {
                    for spelled in node.input.iter().filter(|s| !s.starts_with('^')) {
                        let next = self.graph.value_input(node, spelled)?;
                        self.walk(next, depth + 1)?;
                    }
                    return Ok(());
                }
                Role::Range => self.range(node)?,
                Role::TensorSlices => self.tensor_slices(node)?,
                Role::Tensor => SplitSource::Index { n: 1 },
                Role::List => list(node)?,
                // IndexSplitProvider(kint64max).
                Role::Random => SplitSource::Index { n: i64::MAX as u64 },
                Role::Refused(reason) => return Err(refuse(node, reason)),
                Role::Unknown => {
                    return Err(refuse(
                        node,
                        "coord does not know how TF 2.21 makes split providers for this op",
                    ))
                }
            };
            if self.providers.len() == MAX_PROVIDERS {
                return Err(refuse(
                    node,
                    format!("more than {MAX_PROVIDERS} split providers"),
                ));
            }
            self.providers.push(source);
            return Ok(());
        }
    }

    /// The tensors a source reads, in input order.
    fn tensor_inputs(&self, node: &NodeDef) -> Result<Vec<Value<'g>>, Refusal> {
        node.input
            .iter()
            .filter(|s| !s.starts_with('^'))
            .map(|spelled| evaluate(self.graph, node, spelled, self.glob))
            .collect()
    }

    /// `RangeDataset(start, stop, step)`.
    fn range(&self, node: &NodeDef) -> Result<SplitSource, Refusal> {
        let inputs = self.tensor_inputs(node)?;
        let [start, stop, step] = inputs.as_slice() else {
            return Err(refuse(node, "not the three inputs start, stop, step"));
        };
        let int = |v: &Value<'_>| v.int64_scalar().map_err(|e| refuse(node, e));
        let (start, stop, step) = (int(start)?, int(stop)?, int(step)?);
        if step == 0 {
            return Err(refuse(node, "TF: \"step must be a non-zero integer.\""));
        }
        // TF's counter adds `step` once more after the last value; past int64 that wraps around
        // (signed overflow, undefined in C++; TF 2.21 then hands out negative values forever).
        let count = range_count(start, stop, step);
        if count > 0 {
            let past_last = i128::from(start) + i128::from(count) * i128::from(step);
            if i64::try_from(past_last).is_err() {
                return Err(refuse(
                    node,
                    format!(
                        "range({start}, {stop}, {step}): TF's split provider steps past int64 \
                         after its last value and wraps around; coord does not reproduce that"
                    ),
                ));
            }
        }
        Ok(SplitSource::Range { start, stop, step })
    }

    /// `TensorSliceDataset(components...)`: `n` is component 0's first dimension.
    fn tensor_slices(&self, node: &NodeDef) -> Result<SplitSource, Refusal> {
        let mut first = None;
        for value in self.tensor_inputs(node)? {
            let dims = value.dims().map_err(|e| refuse(node, e))?;
            let Some(&n) = dims.first() else {
                return Err(refuse(
                    node,
                    "TF: \"All components must be at least 1-dimensional\"",
                ));
            };
            if first.is_some_and(|f| f != n) {
                return Err(refuse(
                    node,
                    "TF: \"All components must have the same size in the 0th dimension\"",
                ));
            }
            first = Some(n);
        }
        let n = first.ok_or_else(|| refuse(node, "no components"))?;
        Ok(SplitSource::Index {
            n: u64::try_from(n).map_err(|e| refuse(node, e.to_string()))?,
        })
    }
}

/// `ListDataset(tensors...)`: the inputs are the elements' components, one after the other;
/// `n` = inputs / components per element, with TF's integer division.
fn list(node: &NodeDef) -> Result<SplitSource, Refusal> {
    let components = match node
        .attr
        .get("output_shapes")
        .and_then(|a| a.value.as_ref())
    {
        Some(attr_value::Value::List(list)) => list.shape.len(),
        _ => 0,
    };
    if components == 0 {
        return Err(refuse(
            node,
            "no output_shapes: the number of components is unknown",
        ));
    }
    let inputs = node.input.iter().filter(|s| !s.starts_with('^')).count();
    Ok(SplitSource::Index {
        n: (inputs / components) as u64,
    })
}

fn refuse(node: &NodeDef, reason: impl Into<String>) -> Refusal {
    Refusal::new(&node.op, &node.name, reason)
}

//! The client's `GraphDef` as TF's dispatcher reads it: nodes by name, inputs spelled `name`,
//! `name:k` or `^name` (a control input), and the dataset root — the input of the *last*
//! `_Retval` node, which is what `standalone::Dataset::FromGraph` (data/standalone.cc) runs the
//! graph up to.

use std::collections::HashMap;

use super::refusal::Refusal;
use crate::tensorflow::{GraphDef, NodeDef};

/// The nodes of one graph by name. Borrowed from the `GraphDef`: nothing is copied.
pub(super) struct Graph<'g> {
    def: &'g GraphDef,
    nodes: HashMap<&'g str, &'g NodeDef>,
}

/// One input of a node, parsed.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct InputRef<'s> {
    pub name: &'s str,
    /// Which output of `name`; `u32::MAX` when the spelling is not a number (no op has that
    /// output, so the input is refused where it is used).
    pub output: u32,
    /// `^name`: an ordering edge, not a value.
    pub control: bool,
}

/// Parses `name`, `name:k` or `^name`. TF node names never contain `:`.
pub(super) fn parse_input(spelled: &str) -> InputRef<'_> {
    if let Some(name) = spelled.strip_prefix('^') {
        return InputRef {
            name,
            output: 0,
            control: true,
        };
    }
    match spelled.rsplit_once(':') {
        Some((name, k)) => InputRef {
            name,
            output: k.parse().unwrap_or(u32::MAX),
            control: false,
        },
        None => InputRef {
            name: spelled,
            output: 0,
            control: false,
        },
    }
}

impl<'g> Graph<'g> {
    pub fn new(graph: &'g GraphDef) -> Result<Self, Refusal> {
        let mut nodes = HashMap::with_capacity(graph.node.len());
        for node in &graph.node {
            if nodes.insert(node.name.as_str(), node).is_some() {
                return Err(Refusal::new(
                    &node.op,
                    &node.name,
                    "two nodes have this name (TF's ImportGraphDef refuses the graph)",
                ));
            }
        }
        Ok(Graph { def: graph, nodes })
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The dataset the dispatcher instantiates: the node feeding the last `_Retval`.
    pub fn root(&self) -> Result<&'g NodeDef, Refusal> {
        let Some(retval) = self.def.node.iter().rev().find(|n| n.op == "_Retval") else {
            return Err(Refusal::new(
                "_Retval",
                "",
                "the graph has no _Retval node (TF: \"Failed to find a _Retval op in the given \
                 dataset\")",
            ));
        };
        let Some(fetch) = retval.input.first() else {
            return Err(Refusal::new(
                "_Retval",
                &retval.name,
                "the _Retval node has no input",
            ));
        };
        self.value_input(retval, fetch)
    }

    /// The control inputs of `node`, resolved.
    pub fn control_inputs(&self, node: &NodeDef) -> Result<Vec<&'g NodeDef>, Refusal> {
        node.input
            .iter()
            .map(|s| parse_input(s))
            .filter(|i| i.control)
            .map(|i| self.resolve(node, i.name))
            .collect()
    }

    /// The node whose output 0 `consumer` takes as the input spelled `spelled` (datasets,
    /// constants and the ops evaluated here all have exactly one output).
    pub fn value_input(&self, consumer: &NodeDef, spelled: &str) -> Result<&'g NodeDef, Refusal> {
        let input = parse_input(spelled);
        if input.control || input.output != 0 {
            return Err(Refusal::new(
                &consumer.op,
                &consumer.name,
                format!("input \"{spelled}\" is not the value of a single-output node"),
            ));
        }
        self.resolve(consumer, input.name)
    }

    /// The first data input of `node`: a unary dataset's input dataset.
    pub fn first_input(&self, node: &NodeDef) -> Result<&'g NodeDef, Refusal> {
        match node.input.iter().find(|s| !s.starts_with('^')) {
            Some(spelled) => self.value_input(node, spelled),
            None => Err(Refusal::new(
                &node.op,
                &node.name,
                "the node has no input dataset",
            )),
        }
    }

    fn resolve(&self, consumer: &NodeDef, name: &str) -> Result<&'g NodeDef, Refusal> {
        self.nodes.get(name).copied().ok_or_else(|| {
            Refusal::new(
                &consumer.op,
                &consumer.name,
                format!("input \"{name}\" is not a node of the graph"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_parse_as_tf_spells_them() {
        assert_eq!(
            parse_input("a/b"),
            InputRef {
                name: "a/b",
                output: 0,
                control: false
            }
        );
        assert_eq!(
            parse_input("a:2"),
            InputRef {
                name: "a",
                output: 2,
                control: false
            }
        );
        assert_eq!(
            parse_input("^a"),
            InputRef {
                name: "a",
                output: 0,
                control: true
            }
        );
        assert_eq!(parse_input("a:x").output, u32::MAX);
    }
}

//! [`Refusal`]: why a dataset graph gets no split providers, naming the op and node at fault as
//! TF's own refusals do. A leaf every step of the walk uses.

use std::fmt;

/// Why a dataset graph gets no split providers: the op (and node) at fault, and why. TF's own
/// refusals name the dataset type the same way ("Cannot create split providers for dataset of
/// type TFRecordDataset...").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The op type of the node at fault (`TFRecordDataset`, `_Retval`...).
    pub op: String,
    /// The node's name in the graph; empty when no node is at fault (no `_Retval` at all).
    pub node: String,
    pub reason: String,
}

impl Refusal {
    pub(super) fn new(op: &str, node: &str, reason: impl Into<String>) -> Self {
        Refusal {
            op: op.to_owned(),
            node: node.to_owned(),
            reason: reason.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.node.is_empty() {
            write!(f, "no split providers: op {}: {}", self.op, self.reason)
        } else {
            write!(
                f,
                "no split providers: op {} (node \"{}\"): {}",
                self.op, self.node, self.reason
            )
        }
    }
}

impl std::error::Error for Refusal {}

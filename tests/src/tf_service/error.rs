//! [`TfError`]: an error TensorFlow reported, as a script process relays it. A leaf: the readers
//! and the other processes report through it.

use std::fmt;

use serde_json::Value;

/// An error TensorFlow reported: its status code's name (`INVALID_ARGUMENT`, ...; `UNKNOWN` for
/// a Python exception without one, `HUNG` for a bad-input call that did not return) and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TfError {
    pub code: String,
    pub message: String,
}

impl fmt::Display for TfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl TfError {
    /// The code and the first line of the message, without the `{{function_node ...}}` of the
    /// op that raised it and at most 300 characters of it (some messages carry a whole graph).
    pub fn brief(&self) -> String {
        let mut line = self.message.lines().next().unwrap_or("");
        if line.starts_with("{{function_node") {
            line = line.split_once("}} ").map_or(line, |(_, rest)| rest);
        }
        let cut: String = line.chars().take(300).collect();
        let more = if cut.len() < line.len() || line.len() < self.message.len() {
            " ..."
        } else {
            ""
        };
        format!("{}: {cut}{more}", self.code)
    }

    pub(super) fn from_event(e: &Value) -> TfError {
        TfError {
            code: e["code"].as_str().unwrap_or("?").to_string(),
            message: e["message"].as_str().unwrap_or("").to_string(),
        }
    }
}

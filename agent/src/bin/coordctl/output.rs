//! How coordctl answers: [`Output`] (a table for a person, JSON for scripts), the [`Table`] every
//! listing prints through, and [`fail`], a failure's message and exit code. Every subcommand
//! prints through here, so `-o json` means the same thing everywhere.

use std::process::ExitCode;

use clap::ValueEnum;
use serde_json::{json, Value};
use tonic::{Code, Status};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned columns for a person.
    Table,
    /// JSON for scripts.
    Json,
}

/// Rows with named columns, printed as a table or as a JSON array of objects.
pub struct Table {
    columns: &'static [&'static str],
    rows: Vec<Vec<Value>>,
}

impl Table {
    pub fn new(columns: &'static [&'static str]) -> Self {
        Self {
            columns,
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<Value>) {
        self.rows.push(row);
    }

    pub fn print(&self, out: Output) {
        if out == Output::Json {
            let objects: Vec<Value> = self
                .rows
                .iter()
                .map(|r| {
                    let map = self
                        .columns
                        .iter()
                        .map(|c| c.to_lowercase().replace(' ', "_"))
                        .zip(r.iter().cloned())
                        .collect::<serde_json::Map<_, _>>();
                    Value::Object(map)
                })
                .collect();
            println!("{}", Value::Array(objects));
            return;
        }
        let cells: Vec<Vec<String>> = self
            .rows
            .iter()
            .map(|r| r.iter().map(cell).collect())
            .collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|r| r[i].len())
                    .chain([self.columns[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |values: Vec<String>| {
            let padded: Vec<String> = values
                .iter()
                .zip(&widths)
                .map(|(v, w)| format!("{v:<w$}"))
                .collect();
            println!("{}", padded.join("  ").trim_end());
        };
        line(self.columns.iter().map(|c| c.to_string()).collect());
        for r in cells {
            line(r);
        }
    }
}

/// A value as a table shows it.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// Prints why a command failed (as JSON with `-o json`) and gives the exit code it ends with.
pub fn fail(e: &Status, out: Output) -> ExitCode {
    if out == Output::Json {
        let err = json!({"error": {"code": format!("{:?}", e.code()), "message": e.message()}});
        eprintln!("{err}");
    } else {
        eprintln!("coordctl: {:?}: {}", e.code(), e.message());
    }
    match e.code() {
        Code::Unavailable => ExitCode::from(4),
        Code::InvalidArgument => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

//! `coordctl kv put|get|try-get|ls|rm|watch`: the key-value store.
//!
//! Values are bytes. `put` takes a value too large for an argument list, or binary, from stdin
//! when VALUE is omitted (as etcdctl does); `get --raw` writes the value's bytes back exactly, so
//! `coordctl kv get --raw k > file` round-trips what `coordctl kv put k < file` stored. Without
//! `--raw`, values are shown as text (invalid UTF-8 replaced) with a newline, as before.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use clap::Subcommand;
use coord_agent::watch::{ChangeKind, WatchSet};
use coord_agent::CoordClient;
use serde_json::json;
use tonic::Status;

use super::output::{fail, Output, Table};

/// The largest value read from stdin: what one request may carry (the client's message limit).
/// The ensemble's own limit (`--max-value-bytes`, 4 MiB by default) is lower and is its to tell.
const STDIN_VALUE_LIMIT: u64 = 64 << 20;

#[derive(Subcommand)]
pub enum KvCmd {
    /// Insert a key (fails if it exists, unless --overwrite). Without VALUE, the value is all of
    /// stdin, as bytes.
    Put {
        key: String,
        /// The value; omitted: read from stdin (for large or binary values).
        value: Option<String>,
        #[arg(long)]
        overwrite: bool,
    },
    /// Print a key's value, waiting until it exists.
    Get {
        key: String,
        /// Write the value's bytes to stdout exactly, with no newline (ignores -o).
        #[arg(long)]
        raw: bool,
    },
    /// Print a key's value; exit 3 if it does not exist.
    TryGet {
        key: String,
        /// Write the value's bytes to stdout exactly, with no newline (ignores -o).
        #[arg(long)]
        raw: bool,
    },
    /// List the keys and values under a directory.
    Ls { dir: String },
    /// Delete a key and everything under it.
    Rm { key: String },
    /// Print every change of a key and the keys under it, until interrupted.
    Watch { key: String },
}

pub async fn run(client: &CoordClient, cmd: KvCmd, out: Output) -> Result<ExitCode, Status> {
    match cmd {
        KvCmd::Put {
            key,
            value,
            overwrite,
        } => {
            let value = match value {
                Some(v) => v.into_bytes(),
                None => value_from_stdin(&key)?,
            };
            client.insert(&key, value, overwrite).await?
        }
        KvCmd::Get { key, raw } => print_value(&key, &client.get(&key).await?, raw, out)?,
        KvCmd::TryGet { key, raw } => match client.try_get(&key).await? {
            Some(v) => print_value(&key, &v, raw, out)?,
            None => {
                let e = Status::not_found(format!("key {key:?} not found"));
                fail(&e, out);
                return Ok(ExitCode::from(3));
            }
        },
        KvCmd::Ls { dir } => {
            let mut t = Table::new(&["KEY", "VALUE"]);
            for (k, v) in client.get_dir(&dir).await? {
                t.push(vec![json!(k), json!(text(&v))]);
            }
            t.print(out);
        }
        KvCmd::Rm { key } => client.delete(&key).await?,
        KvCmd::Watch { key } => return watch(client, &key, out).await,
    }
    Ok(ExitCode::SUCCESS)
}

fn text(v: &[u8]) -> String {
    String::from_utf8_lossy(v).into_owned()
}

/// All of stdin, for `put` without VALUE. A person at a terminal is told where the value is
/// being read from, rather than left before a silent prompt.
fn value_from_stdin(key: &str) -> Result<Vec<u8>, Status> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprintln!("coordctl: reading the value of {key:?} from stdin (end it with Ctrl-D)");
    }
    let mut value = Vec::new();
    stdin
        .lock()
        .take(STDIN_VALUE_LIMIT + 1)
        .read_to_end(&mut value)
        .map_err(|e| Status::invalid_argument(format!("cannot read the value from stdin: {e}")))?;
    if value.len() as u64 > STDIN_VALUE_LIMIT {
        return Err(Status::invalid_argument(format!(
            "the value on stdin is larger than {STDIN_VALUE_LIMIT} bytes, the most one request carries"
        )));
    }
    Ok(value)
}

/// A value as `get` prints it: the bytes alone (`raw`), or as text with a newline (a JSON object
/// with `-o json`).
fn print_value(key: &str, v: &[u8], raw: bool, out: Output) -> Result<(), Status> {
    if raw {
        let mut stdout = std::io::stdout().lock();
        return stdout
            .write_all(v)
            .and_then(|()| stdout.flush())
            .map_err(|e| Status::unknown(format!("cannot write the value to stdout: {e}")));
    }
    if out == Output::Json {
        println!("{}", json!({"key": key, "value": text(v)}));
    } else {
        println!("{}", text(v));
    }
    Ok(())
}

/// Prints every change under `key` as it commits (resuming across leader changes), until
/// interrupted or the watch fails.
async fn watch(client: &CoordClient, key: &str, out: Output) -> Result<ExitCode, Status> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watches = WatchSet::new(client.clone());
    watches.start(
        key,
        std::sync::Arc::new(move |changes| {
            let _ = tx.send(changes);
        }),
    )?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
            got = rx.recv() => match got {
                None => return Ok(ExitCode::SUCCESS),
                Some(Err(e)) => return Err(e),
                Some(Ok(changes)) => {
                    for c in changes {
                        let kind = match c.kind {
                            ChangeKind::Put => "PUT",
                            ChangeKind::Delete => "DELETE",
                        };
                        let v = String::from_utf8_lossy(&c.value);
                        if out == Output::Json {
                            println!(
                                "{}",
                                json!({"kind": kind, "key": c.key, "value": v, "revision": c.revision})
                            );
                        } else {
                            println!("{kind}\t{}\t{v}\t{}", c.key, c.revision);
                        }
                    }
                }
            }
        }
    }
}

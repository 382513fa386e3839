//! A round of simulated torch ranks, run on this runtime or, past what one process may hold
//! connections ([`ranks_per_process`]: this host allows a process 20,000 open files and cannot
//! raise it, while issue 42's round is 100,000 ranks), spread over child processes.
//!
//! Each child is `coord-bench torch-ranks` with its share of the ranks. Over its stdin and stdout:
//! it says `ready` once its runtime is up, starts its ranks on the parent's `go` (sent to all
//! children at once, so that process starts are not timed), answers `done` with when its last
//! rank finished each step (nanoseconds since its `go`) or `error` with why, and holds its
//! connections until its stdin closes: no rank leaves before every rank of the round is done.
//! A child whose parent dies sees its stdin close and ends; children are killed when dropped.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use super::init::{ranks_per_process, run_ranks, Round, Steps};
use crate::bench::conntrack;

/// How long a child may take to start its runtime.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long a round waits for the connection tracker's room: its closed connections' entries
/// last 120 s.
const TRACKER_ROOM_WITHIN: Duration = Duration::from_secs(180);

/// `coord-bench torch-ranks`: a child's share of a round.
#[derive(clap::Args, Clone)]
pub struct ChildArgs {
    /// The round's stores (comma separated), as [`Round::stores`].
    #[arg(long, value_delimiter = ',', required = true)]
    pub stores: Vec<String>,
    /// The round's ranks in all.
    #[arg(long)]
    pub world: usize,
    /// The round's tag (keys under `/{tag}`).
    #[arg(long)]
    pub tag: String,
    /// The first rank of this child's share.
    #[arg(long)]
    pub first: usize,
    /// How many ranks this child runs.
    #[arg(long)]
    pub count: usize,
}

fn nanos(d: Duration) -> u128 {
    d.as_nanos()
}

/// A `done` line: the four steps in nanoseconds.
fn done_line(s: &Steps) -> String {
    format!(
        "done {} {} {} {}",
        nanos(s.connected),
        nanos(s.added),
        nanos(s.released),
        nanos(s.done)
    )
}

/// A child's answer: its steps, or why it failed.
fn parse_answer(line: &str) -> Result<Steps, String> {
    if let Some(why) = line.strip_prefix("error ") {
        return Err(why.to_string());
    }
    let fields: Vec<u64> = line
        .strip_prefix("done ")
        .ok_or_else(|| format!("unexpected answer {line:?}"))?
        .split(' ')
        .map(|f| f.parse::<u64>().map_err(|e| format!("{line:?}: {e}")))
        .collect::<Result<_, _>>()?;
    match fields[..] {
        [c, a, r, d] => Ok(Steps {
            connected: Duration::from_nanos(c),
            added: Duration::from_nanos(a),
            released: Duration::from_nanos(r),
            done: Duration::from_nanos(d),
        }),
        _ => Err(format!("{line:?}: not four steps")),
    }
}

/// Reads stdin's next line on a blocking thread (tokio's stdin is not built here): `None` at its
/// end.
async fn next_line() -> Result<Option<String>, String> {
    tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) => Ok(None),
            Ok(_) => Ok(Some(line.trim_end().to_string())),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Writes one line to stdout, flushed.
fn say(line: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| e.to_string())
}

/// The child's side: runs its share when told, says how it went, holds its connections until
/// its stdin closes.
pub async fn child(args: ChildArgs) -> Result<(), String> {
    // Quietly: the parent said so already, once.
    coord_agent::open_files::raise_to_hard_limit().map_err(|e| e.to_string())?;
    let round = Round {
        stores: args.stores,
        world: args.world,
        tag: args.tag,
    };
    say("ready")?;
    match next_line().await? {
        Some(go) if go == "go" => {}
        other => return Err(format!("expected go from the parent, read {other:?}")),
    }
    let start = Instant::now();
    let ranks = args.first..args.first + args.count;
    let (answer, held) = match run_ranks(&round, ranks, start).await {
        Ok((steps, held)) => (done_line(&steps), held),
        Err(e) => (format!("error {}", e.replace('\n', " ")), Vec::new()),
    };
    say(&answer)?;
    // Until the round is over (or the parent gone).
    while next_line().await?.is_some() {}
    drop(held);
    Ok(())
}

struct Running {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    ranks: std::ops::Range<usize>,
}

impl Running {
    async fn line(&mut self) -> Result<String, String> {
        match self.lines.next_line().await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err(format!(
                "the child of ranks {:?} ended without answering",
                self.ranks
            )),
            Err(e) => Err(format!("reading the child of ranks {:?}: {e}", self.ranks)),
        }
    }
}

/// Runs `round` in children of at most `per_process` ranks each: the time from `go` until every
/// child had answered, and when the last rank finished each step.
async fn in_children(
    round: &Round,
    per_process: usize,
    timeout: Duration,
) -> Result<(Duration, Steps), String> {
    let exe = std::env::current_exe().map_err(|e| format!("coord-bench's own path: {e}"))?;
    let children = round.world.div_ceil(per_process);
    let mut running = Vec::with_capacity(children);
    for i in 0..children {
        let ranks = i * round.world / children..(i + 1) * round.world / children;
        let mut child = Command::new(&exe)
            .arg("torch-ranks")
            .arg("--stores")
            .arg(round.stores.join(","))
            .args(["--world", &round.world.to_string()])
            .args(["--tag", &round.tag])
            .args(["--first", &ranks.start.to_string()])
            .args(["--count", &ranks.len().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting {exe:?} torch-ranks: {e}"))?;
        let stdout = child.stdout.take().ok_or("the child's stdout")?;
        running.push(Running {
            child,
            lines: BufReader::new(stdout).lines(),
            ranks,
        });
    }
    eprintln!(
        "    {} ranks in {children} processes of at most {per_process}",
        round.world
    );
    for r in &mut running {
        match tokio::time::timeout(READY_WITHIN, r.line()).await {
            Ok(Ok(line)) if line == "ready" => {}
            Ok(Ok(line)) => return Err(format!("a child said {line:?}, not ready")),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(format!("a child was not ready within {READY_WITHIN:?}")),
        }
    }
    let start = Instant::now();
    for r in &mut running {
        let stdin = r.child.stdin.as_mut().ok_or("the child's stdin")?;
        stdin
            .write_all(b"go\n")
            .await
            .map_err(|e| format!("telling a child to go: {e}"))?;
    }
    // Read together: a child whose ranks failed ends the round at once, while the others' ranks
    // would wait for it to the deadline.
    let answers = async {
        let mut each: futures::stream::FuturesUnordered<_> = (running.iter_mut())
            .map(|r| async move { parse_answer(&r.line().await?) })
            .collect();
        let mut last = Steps::default();
        while let Some(steps) = futures::StreamExt::next(&mut each).await {
            last = last.latest(steps?);
        }
        Ok::<Steps, String>(last)
    };
    let last = tokio::time::timeout(timeout, answers)
        .await
        .map_err(|_| format!("not all done within {timeout:?}"))??;
    let took = start.elapsed();
    // The round is over: every child lets its connections go and ends.
    for mut r in running {
        drop(r.child.stdin.take());
        if tokio::time::timeout(Duration::from_secs(30), r.child.wait())
            .await
            .is_err()
        {
            eprintln!("    the child of ranks {:?} did not end: killed", r.ranks);
        }
    }
    Ok((took, last))
}

/// Runs `round`'s ranks; the time until every one of them is done, or why not (a deadline of
/// `timeout` in all). Past [`ranks_per_process`] ranks, they run in child processes. Prints when
/// the last rank had connected (VALIDATE and PING answered), ADDed, been released from its WAIT
/// and read the master address: where the time goes. Waits first, untimed, for the kernel's
/// connection tracker to have room for the round (see [`conntrack`]), and says what it dropped.
pub async fn init_ranks(round: &Round, timeout: Duration) -> Result<Duration, String> {
    conntrack::wait_for_room(round.world, TRACKER_ROOM_WITHIN).await;
    let dropped_before = conntrack::dropped();
    let per_process = ranks_per_process();
    let what = format!("{} ranks on {}", round.world, round.stores.join(","));
    let (took, last) = if round.world <= per_process {
        let start = Instant::now();
        let (last, held) = tokio::time::timeout(timeout, run_ranks(round, 0..round.world, start))
            .await
            .map_err(|_| format!("{what}: not all done within {timeout:?}"))??;
        let took = start.elapsed();
        drop(held);
        (took, last)
    } else {
        in_children(round, per_process, timeout)
            .await
            .map_err(|e| format!("{what}: {e}"))?
    };
    let s = |d: Duration| format!("{:.3}", d.as_secs_f64());
    let dropped = match (dropped_before, conntrack::dropped()) {
        (Some(before), Some(after)) if after > before => {
            format!(
                " (the connection tracker dropped {} packets)",
                after - before
            )
        }
        _ => String::new(),
    };
    eprintln!(
        "    the last rank connected at {} s, had ADDed at {}, was released at {}, done at {}{dropped}",
        s(last.connected),
        s(last.added),
        s(last.released),
        s(last.done)
    );
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_steps_read_back_as_written() {
        let s = Steps {
            connected: Duration::from_millis(1500),
            added: Duration::from_nanos(2_000_000_001),
            released: Duration::from_secs(3),
            done: Duration::from_secs(4),
        };
        assert_eq!(parse_answer(&done_line(&s)), Ok(s));
        assert_eq!(
            parse_answer("error rank 3: refused"),
            Err("rank 3: refused".into())
        );
        assert!(parse_answer("done 1 2 3").is_err());
        assert!(parse_answer("ready").is_err());
    }
}

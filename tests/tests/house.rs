//! The house rules (STYLE.md, issue 37), checked over the whole workspace so that they stay kept:
//!
//! - **No import circle.** No two files of a crate use each other's items, directly or round a
//!   longer circle, so every crate reads bottom up. Every crate of the workspace is read from its
//!   roots (`src/lib.rs`, `src/main.rs`, `src/bin/`, `tests/`, `benches/`, `examples/`,
//!   `build.rs`) the way rustc finds its modules (`house/modules.rs`); what counts as one file
//!   using another is written in `house/graph.rs`. Every `.rs` file must belong to a crate, or the
//!   check could not see it.
//! - **No `.rs` file over 600 lines**: split by concept before that. Files marked `@generated`
//!   and anything under `target/` are not ours to split.
//! - **No "seed 00N" wording** in code or docs (`.rs`, `.md`, `.py`, `.proto`, `.sh`): the
//!   seed documents were the brief, not a reference a reader can follow; say what TensorFlow
//!   does, by its own names.
//!
//! Each check lists every offender. `HOUSE_ROOT=/path/to/checkout` checks another checkout (an
//! older commit, say, to see the checks fail on what they were written against).

#[path = "house/graph.rs"]
mod graph;
#[path = "house/modules.rs"]
mod modules;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use graph::FileGraph;
use modules::Crate;

const MAX_LINES: usize = 600;

/// The checkout checked: `HOUSE_ROOT`, or this workspace.
fn root() -> PathBuf {
    match std::env::var_os("HOUSE_ROOT") {
        Some(r) => PathBuf::from(r),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the tests crate sits in the workspace")
            .to_path_buf(),
    }
}

/// The workspace's member directories, from its `Cargo.toml`.
fn members(root: &Path) -> Vec<PathBuf> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("the workspace Cargo.toml");
    let list = manifest
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("members = [...] in the workspace Cargo.toml");
    list.split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root.join(m))
        .collect()
}

/// Every file under `dir` (not under `target/` or a hidden directory) whose name ends in one of
/// `extensions`, in order.
fn files_under(dir: &Path, extensions: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    todo.push(path);
                }
            } else if extensions.iter().any(|e| name.ends_with(&format!(".{e}"))) {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The crate roots of the package in `dir`, as cargo finds them.
fn crate_roots(dir: &Path) -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["src/lib.rs", "src/main.rs", "build.rs"]
        .iter()
        .map(|r| dir.join(r))
        .collect();
    for targets in ["src/bin", "tests", "benches", "examples"] {
        let Ok(entries) = fs::read_dir(dir.join(targets)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            roots.push(if path.is_dir() {
                path.join("main.rs")
            } else {
                path
            });
        }
    }
    roots.retain(|r| r.is_file() && r.extension().is_some_and(|e| e == "rs"));
    roots.sort();
    roots
}

fn shown(root: &Path, file: &Path) -> String {
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

#[test]
fn no_import_circle() {
    let root = root();
    let mut graph = FileGraph::default();
    let mut read = BTreeSet::new();
    let mut problems = Vec::new();
    let mut ours = Vec::new();
    for member in members(&root) {
        for crate_root in crate_roots(&member) {
            match Crate::load(&crate_root) {
                Ok(krate) => {
                    graph.add_crate(&krate);
                    read.extend(krate.files().into_iter().map(Path::to_path_buf));
                }
                Err(e) => problems.push(e),
            }
        }
        for dir in ["src", "tests", "benches", "examples"] {
            ours.extend(files_under(&member.join(dir), &["rs"]));
        }
    }
    for file in ours.iter().filter(|f| !read.contains(*f)) {
        problems.push(format!(
            "{} belongs to no crate (no `mod` declares it)",
            shown(&root, file)
        ));
    }
    for (set, circle) in graph.circles() {
        let mut steps = vec![shown(&root, &circle[0])];
        for pair in circle.windows(2) {
            let why = &graph.edges[&pair[0]][&pair[1]];
            steps.push(format!(
                "  → {}   ({}:{} names {})",
                shown(&root, &pair[1]),
                shown(&root, &pair[0]),
                why.line,
                why.path
            ));
        }
        let members: Vec<String> = set.iter().map(|f| shown(&root, f)).collect();
        let uses = |a: &PathBuf, b: &PathBuf| graph.edges.get(a).is_some_and(|e| e.contains_key(b));
        let pairs: Vec<String> = set
            .iter()
            .flat_map(|a| set.iter().map(move |b| (a, b)))
            .filter(|(a, b)| a < b && uses(a, b) && uses(b, a))
            .map(|(a, b)| format!("  {} ↔ {}", shown(&root, a), shown(&root, b)))
            .collect();
        let pairs = match pairs.is_empty() {
            true => String::new(),
            false => format!("\nfiles that use each other:\n{}", pairs.join("\n")),
        };
        problems.push(format!(
            "import circle among {}:\n{}{pairs}",
            members.join(", "),
            steps.join("\n")
        ));
    }
    assert!(
        problems.is_empty(),
        "{} problem(s) in the module graph of {}:\n\n{}",
        problems.len(),
        root.display(),
        problems.join("\n\n")
    );
    assert!(read.len() > 100, "only {} files read", read.len());
}

#[test]
fn no_file_over_600_lines() {
    let root = root();
    let mut long = Vec::new();
    for file in files_under(&root, &["rs"]) {
        let text = fs::read_to_string(&file).unwrap_or_default();
        if text.lines().take(5).any(|l| l.contains("@generated")) {
            continue;
        }
        let lines = text.lines().count();
        if lines > MAX_LINES {
            long.push(format!("{} has {lines} lines", shown(&root, &file)));
        }
    }
    assert!(
        long.is_empty(),
        "{} file(s) over {MAX_LINES} lines; split each by concept:\n{}",
        long.len(),
        long.join("\n")
    );
}

/// Where `line` says "seed" (or "seeds"), blanks, then a three-digit number starting with 0.
fn seed_number_in(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    lower.match_indices("seed").any(|(at, word)| {
        let rest = lower[at + word.len()..].trim_start_matches('s');
        let digits = rest.trim_start_matches([' ', '\t']);
        let number: String = digits.chars().take_while(char::is_ascii_digit).collect();
        digits.len() < rest.len() && number.len() == 3 && number.starts_with('0')
    })
}

#[test]
fn no_seed_numbers_in_code_or_docs() {
    let root = root();
    let mut found = Vec::new();
    for file in files_under(&root, &["rs", "md", "py", "proto", "sh"]) {
        let text = fs::read_to_string(&file).unwrap_or_default();
        for (n, line) in text.lines().enumerate() {
            if seed_number_in(line) {
                found.push(format!(
                    "{}:{}: {}",
                    shown(&root, &file),
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "{} line(s) name a seed by number; say what TensorFlow does instead:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn the_seed_wording_check_matches_only_seed_numbers() {
    let number = ["seed", " ", "00", "3"].concat();
    assert!(seed_number_in(&format!(
        "TensorFlow's protocol, {number}). When"
    )));
    assert!(seed_number_in(&["Seeds", "\t", "001"].concat()));
    assert!(!seed_number_in("--seed 70261126 and seeds 5000-5199"));
    assert!(!seed_number_in("xorshift(0x00C0_FFEE_5EED) seeded 0"));
    assert!(!seed_number_in(&["seed", "0001"].concat()));
}

/// The checker on a small crate whose edges are known: each kind of path it reads, each thing it
/// must not count, and a circle through a re-export.
#[test]
fn the_circle_check_sees_exactly_the_uses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        fs::write(path, text).expect("write");
    };
    // The root declares and re-exports: declaring is no use.
    write(
        "lib.rs",
        "//! Uses `crate::low::Low`, in words only.\nmod low;\nmod mid;\nmod top;\nmod pair;\nmod glob;\npub use low::Low;\npub use std::fmt;\n",
    );
    // A macro's `super::` is its expansion site's: no edge to top.rs from where it is written;
    // its `$crate::` is absolute (through the re-export, to pair/child.rs).
    write(
        "low.rs",
        "pub struct Low;\n#[cfg(test)]\nmod tests { use super::*; fn f() -> Low { Low } }\nconst S: &str = \"crate::top::Top\";\nmacro_rules! m { () => { super::top::Top; $crate::pair::Child } }\n",
    );
    // A re-export of the root is seen through: `crate::Low` is low.rs's, `crate::fmt` std's.
    write(
        "mid.rs",
        "use crate::{fmt, Low};\npub fn mid(_: Low) {}\npub fn make() -> crate::top::Top { todo!() }\nfn g(_: &dyn fmt::Debug) {}\n",
    );
    // `mid` uses `top` in code, `top` uses `mid` through an aliased module import: a circle.
    write(
        "top.rs",
        "use super::mid as m;\npub struct Top;\nfn f() { m::mid(crate::low::Low) }\n",
    );
    // A parent whose own item a child uses, and which uses that child: a circle.
    write(
        "pair/mod.rs",
        "mod child;\npub use child::Child;\npub struct Parent;\n",
    );
    write("pair/child.rs", "pub struct Child(super::Parent);\n");
    // A glob of a parent that only re-exports: what it brings in is its siblings' items.
    write(
        "glob/mod.rs",
        "mod a;\nmod b;\npub use a::A;\npub use b::f;\n",
    );
    write(
        "glob/a.rs",
        "pub struct A;\npub const S: &'static str = \"\";\n",
    );
    write(
        "glob/b.rs",
        "use super::*;\npub fn f(x: A) -> A { let y = x; \"1\".parse::<u8>().map(str::len); y }\n",
    );
    let krate = Crate::load(&dir.path().join("lib.rs")).expect("load");
    let mut graph = FileGraph::default();
    graph.add_crate(&krate);
    let name = |p: &Path| shown(dir.path(), p);
    let edges: BTreeSet<(String, String)> = graph
        .edges
        .iter()
        .flat_map(|(from, to)| to.keys().map(move |t| (name(from), name(t))))
        .collect();
    let expected: BTreeSet<(String, String)> = [
        ("lib.rs", "low.rs"),
        ("mid.rs", "low.rs"),
        ("mid.rs", "top.rs"),
        ("top.rs", "mid.rs"),
        ("top.rs", "low.rs"),
        ("glob/mod.rs", "glob/a.rs"),
        ("glob/mod.rs", "glob/b.rs"),
        ("glob/b.rs", "glob/a.rs"),
        ("low.rs", "pair/child.rs"),
        ("pair/mod.rs", "pair/child.rs"),
        ("pair/child.rs", "pair/mod.rs"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(edges, expected);
    let circles: Vec<Vec<String>> = graph
        .circles()
        .into_iter()
        .map(|(set, _)| set.iter().map(|f| name(f)).collect())
        .collect();
    assert_eq!(
        circles,
        [
            vec!["mid.rs", "top.rs"],
            vec!["pair/child.rs", "pair/mod.rs"]
        ]
    );
}

//! TF's glob for the local filesystem: `GetMatchingPaths` (xla/tsl/platform/file_system_helper.cc)
//! with `FileSystem::Match` = `fnmatch(pattern, path, FNM_PATHNAME)` — what `MatchingFiles`, the
//! op inside `list_files`, evaluates on a TF dispatcher.
//!
//! Semantics kept: the pattern is split into its directory prefixes and expanded level by level
//! from the last prefix without wildcards (`*?[\`); a pattern with no directory part is taken
//! relative to `./` (so its matches read `./name`); a pattern without wildcards is returned as
//! is when the path exists (a directory too); a trailing `/` matches files as well as
//! directories; hidden files match `*` (no `FNM_PERIOD`); unreadable directories are skipped.
//! Characters, not bytes, are matched (`?` is one `ñ`): TF under Python runs in a UTF-8 locale;
//! names that are not UTF-8 are matched in their lossy form.
//!
//! `MatchingFiles` sorts what it returns; so does this. Under dynamic sharding only the *number*
//! of matches matters: the `TensorSliceDataset` over them hands out indexes, not names.
//!
//! [`Glob`] is the callback the graph's evaluation takes, so that the rest of the module stays
//! free of I/O; [`local_matching_paths`] is the one the server passes in.

use std::fs;

/// Glob callback: the sorted matches of one pattern, with TF's `GetMatchingPaths` semantics.
pub type Glob<'a> = &'a dyn Fn(&str) -> Result<Vec<String>, String>;

const GLOB_CHARS: &[char] = &['*', '?', '[', '\\'];

/// The paths matching `pattern` on the local filesystem, sorted: TF's `GetMatchingPaths`.
/// Refuses patterns with a URI scheme (`gs://...`): those are not local.
pub fn local_matching_paths(pattern: &str) -> Result<Vec<String>, String> {
    if pattern.is_empty() {
        return Ok(Vec::new());
    }
    if pattern.contains("://") {
        return Err(format!("\"{pattern}\" is not a local path"));
    }
    let dirs = directory_prefixes(pattern);
    let first_glob = dirs
        .iter()
        .position(|d| d.contains(GLOB_CHARS))
        .unwrap_or(dirs.len());
    if first_glob == dirs.len() {
        let exists = fs::metadata(pattern).is_ok();
        return Ok(if exists {
            vec![pattern.to_owned()]
        } else {
            Vec::new()
        });
    }
    let Some(start) = first_glob.checked_sub(1) else {
        return Ok(Vec::new()); // unreachable: the first prefix never has a wildcard
    };
    let last = dirs.len() - 1;
    let mut results = Vec::new();
    let mut level = vec![(dirs[start].clone(), start)];
    while !level.is_empty() {
        let mut next = Vec::new();
        for (parent, at) in level {
            let index = at + 1;
            let Ok(entries) = fs::read_dir(&parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = join_path(&parent, &entry.file_name().to_string_lossy());
                if !fnmatch(&dirs[index], &path) {
                    continue;
                }
                if index == last {
                    results.push(path);
                } else if fs::metadata(&path).is_ok_and(|m| m.is_dir()) {
                    next.push((path, index));
                }
            }
        }
        level = next;
    }
    results.sort();
    Ok(results)
}

/// `AllDirectoryPrefixes`: `/a/b*/c` → `["/", "/a", "/a/b*", "/a/b*/c"]`, after the pattern is
/// anchored at `.` when its fixed prefix has no directory, without a trailing `/`.
fn directory_prefixes(pattern: &str) -> Vec<String> {
    let fixed = &pattern[..pattern.find(GLOB_CHARS).unwrap_or(pattern.len())];
    let patched = if dirname(fixed).is_empty() {
        join_path(".", pattern)
    } else {
        pattern.to_owned()
    };
    let mut dir = patched.as_str();
    if pattern.ends_with('/') {
        dir = dirname(dir);
    }
    let mut dirs = Vec::new();
    while !dir.is_empty() {
        dirs.push(dir.to_owned());
        let parent = dirname(dir);
        if parent == dir {
            break;
        }
        dir = parent;
    }
    dirs.reverse();
    dirs
}

/// `io::Dirname`: everything before the last `/`; `/` for `/x`; empty without a `/`.
fn dirname(path: &str) -> &str {
    match path.rfind('/') {
        None => "",
        Some(0) => "/",
        Some(pos) => &path[..pos],
    }
}

/// `io::JoinPath` of two parts: one `/` between them.
fn join_path(dir: &str, name: &str) -> String {
    match (dir.ends_with('/'), name.strip_prefix('/')) {
        (true, Some(rest)) => format!("{dir}{rest}"),
        (true, None) | (false, Some(_)) => format!("{dir}{name}"),
        (false, None) => format!("{dir}/{name}"),
    }
}

/// `fnmatch(pattern, path, FNM_PATHNAME)` (glibc): `*` and `?` never match `/`, nor does a
/// bracket expression (`[a-z]`, `[!x]`, `[^x]`, `[[:alpha:]]`); `\` quotes the next character;
/// an unterminated `[` is literal.
pub(super) fn fnmatch(pattern: &str, path: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let s: Vec<char> = path.chars().collect();
    let (mut pi, mut si) = (0, 0);
    // Where the last `*` resumes: (pattern index after it, string index it has reached).
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() {
            let step = match p[pi] {
                '*' => {
                    while p.get(pi) == Some(&'*') {
                        pi += 1;
                    }
                    star = Some((pi, si));
                    continue;
                }
                '?' => (s[si] != '/').then_some(pi + 1),
                '[' => match bracket(&p, pi, s[si]) {
                    Some((matched, next)) => matched.then_some(next),
                    None => (s[si] == '[').then_some(pi + 1),
                },
                '\\' => match p.get(pi + 1) {
                    Some(&c) => (c == s[si]).then_some(pi + 2),
                    None => return false, // a trailing `\` never matches
                },
                c => (c == s[si]).then_some(pi + 1),
            };
            if let Some(next) = step {
                pi = next;
                si += 1;
                continue;
            }
        }
        // Mismatch: let the last `*` take one more character, unless that is a `/`.
        match star {
            Some((after, reached)) if s[reached] != '/' => {
                star = Some((after, reached + 1));
                pi = after;
                si = reached + 1;
            }
            _ => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The bracket expression opening at `p[open]` against `c`: whether it matches and where the
/// pattern resumes, or `None` when it is not terminated (then `[` is a literal).
fn bracket(p: &[char], open: usize, c: char) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = matches!(p.get(i), Some('!' | '^'));
    if negate {
        i += 1;
    }
    let mut matched = false;
    let mut first = true;
    loop {
        let &ch = p.get(i)?;
        if ch == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        if ch == '[' && p.get(i + 1) == Some(&':') {
            if let Some(len) = p[i + 2..].windows(2).position(|w| w == [':', ']']) {
                let name: String = p[i + 2..i + 2 + len].iter().collect();
                matched |= class_matches(&name, c);
                i += len + 4;
                continue;
            }
        }
        let mut lo = ch;
        if ch == '\\' {
            i += 1;
            lo = *p.get(i)?;
        }
        i += 1;
        if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|&h| h != ']') {
            let mut hi = p[i + 1];
            i += 2;
            if hi == '\\' {
                hi = *p.get(i)?;
                i += 1;
            }
            matched |= lo <= c && c <= hi;
        } else {
            matched |= lo == c;
        }
    }
    // FNM_PATHNAME: a `/` is never matched by a bracket expression.
    Some((c != '/' && matched != negate, i))
}

fn class_matches(name: &str, c: char) -> bool {
    match name {
        "alnum" => c.is_alphanumeric(),
        "alpha" => c.is_alphabetic(),
        "blank" => c == ' ' || c == '\t',
        "cntrl" => c.is_control(),
        "digit" => c.is_ascii_digit(),
        "graph" => !c.is_control() && !c.is_whitespace(),
        "lower" => c.is_lowercase(),
        "print" => !c.is_control(),
        "punct" => c.is_ascii_punctuation(),
        "space" => c.is_whitespace(),
        "upper" => c.is_uppercase(),
        "xdigit" => c.is_ascii_hexdigit(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_follow_tf() {
        assert_eq!(
            directory_prefixes("/tmp/d/*.txt"),
            ["/", "/tmp", "/tmp/d", "/tmp/d/*.txt"]
        );
        assert_eq!(directory_prefixes("*.txt"), [".", "./*.txt"]);
        assert_eq!(directory_prefixes("a*/b"), [".", "./a*", "./a*/b"]);
        assert_eq!(directory_prefixes("x/a*"), ["x", "x/a*"]);
        assert_eq!(directory_prefixes("/tmp/*/"), ["/", "/tmp", "/tmp/*"]);
        assert_eq!(join_path("/", "tmp"), "/tmp");
        assert_eq!(join_path(".", "a"), "./a");
        assert_eq!(dirname("/a"), "/");
        assert_eq!(dirname("a"), "");
    }

    #[test]
    fn fnmatch_is_glibc_with_fnm_pathname() {
        let yes = [
            ("*.txt", ".hidden.txt"),
            ("a*b*c", "a_b_b_c"),
            ("?.txt", "ñ.txt"),
            ("[!a].txt", "b.txt"),
            ("[^a].txt", "b.txt"),
            ("[]x]", "]"),
            ("[a-]", "-"),
            ("x\\[1\\].txt", "x[1].txt"),
            ("x[[]1].txt", "x[1].txt"),
            ("[[:alpha:]]", "ñ"),
            ("a[", "a["),
            ("/d/*/f", "/d/x/f"),
            ("**", "abc"),
        ];
        for (p, s) in yes {
            assert!(fnmatch(p, s), "{p} should match {s}");
        }
        let no = [
            ("*", "a/b"),
            ("?", "/"),
            ("a[/]b", "a/b"),
            ("[!a]", "/"),
            ("a\\", "a\\"),
            ("[[:digit:]]", "x"),
            ("*.txt", "a.txt/"),
            ("/d/*", "/d/x/f"),
        ];
        for (p, s) in no {
            assert!(!fnmatch(p, s), "{p} should not match {s}");
        }
    }
}

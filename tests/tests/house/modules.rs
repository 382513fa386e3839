//! A crate's modules as rustc finds them, and every path each module's code names.
//!
//! The crate is read from its root file down, following `mod name;` the way rustc does
//! (`name.rs` or `name/mod.rs` beside the declaring file, in the declaring file's own directory for
//! `lib.rs`/`main.rs`/`mod.rs`, or a `#[path = "…"]`), so what is read is exactly the crate, and a
//! file no crate declares is known as such. `mod name { … }` blocks are modules too, held by the
//! file they are written in. Sources are lexed with `proc_macro2`, so comments, doc comments and
//! string literals never look like code.
//!
//! Per module it keeps what a path lookup needs: its child modules, the names it defines
//! (`fn`, `struct`, `enum`, `union`, `trait`, `type`, `const`, `static`, `macro_rules!`), its
//! `use` imports (name → path, and glob paths) — at the top level, and separately those inside
//! function bodies and other blocks, which only the module's own code sees — every path its code
//! names ([`Ref`]): each leaf of a `use`, and each path of two or more segments (`a::b`,
//! `super::x`, `crate::a::b`, `$crate::a` in macros) anywhere else, attributes aside — and every
//! lone name, which a glob import may have brought in. Declaring a module (`mod x;`) is not a
//! path: a parent does not use its child by declaring it. A `macro_rules!` body's paths are
//! resolved where the macro is expanded, so only its crate-absolute ones (`$crate::…`) are read.
//!
//! Resolution is in `graph.rs`; this module only reads.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use proc_macro2::{Delimiter, Spacing, TokenStream, TokenTree};

pub type ModId = usize;

/// One module: a file, or a `mod name { … }` block inside one.
#[derive(Default)]
pub struct Module {
    pub parent: Option<ModId>,
    /// The file that holds the module's code (an inline module's: the file it is written in).
    pub file: PathBuf,
    pub children: BTreeMap<String, ModId>,
    /// The names the module defines itself.
    pub items: BTreeSet<String>,
    /// Top-level `use`: the name brought in → the path it names, as written.
    pub imports: BTreeMap<String, Vec<String>>,
    /// Top-level `use path::*`.
    pub globs: Vec<Vec<String>>,
    /// `use` inside blocks (function bodies, `impl`s): seen only by this module's own paths.
    pub block_imports: BTreeMap<String, Vec<String>>,
    pub block_globs: Vec<Vec<String>>,
    /// Every path the module's code names.
    pub refs: Vec<Ref>,
    /// Every lone name in the module's code (not a field or method after `.`, not a field name
    /// before `:`), and its line: what a glob import may have brought in.
    pub names: Vec<(String, usize)>,
}

/// A path named by a module's code, where it is named.
pub struct Ref {
    pub path: Vec<String>,
    pub line: usize,
    pub kind: RefKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum RefKind {
    /// A leaf of a `use` (`use a::b::C`, `use a::b as c`, `use a::{self}`).
    Use,
    /// `use a::b::*`.
    Glob,
    /// A path in code: a type, a call, a pattern, a macro's body.
    Code,
}

/// One crate: its modules, the root first.
pub struct Crate {
    pub modules: Vec<Module>,
}

impl Crate {
    /// Reads the crate whose root file is `root` (`lib.rs`, `main.rs`, a test or a binary).
    pub fn load(root: &Path) -> Result<Crate, String> {
        let mut krate = Crate {
            modules: Vec::new(),
        };
        let dir = root.parent().unwrap_or(Path::new("."));
        krate.load_file(root, "", None, dir)?;
        Ok(krate)
    }

    /// Every file the crate is made of.
    pub fn files(&self) -> BTreeSet<&Path> {
        self.modules.iter().map(|m| m.file.as_path()).collect()
    }

    /// Reads `file` as module `name` of `parent`; its `mod x;` children are looked for in
    /// `child_dir`.
    fn load_file(
        &mut self,
        file: &Path,
        name: &str,
        parent: Option<ModId>,
        child_dir: &Path,
    ) -> Result<ModId, String> {
        let text =
            fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let tokens = TokenStream::from_str(&text)
            .map_err(|e| format!("cannot lex {}: {e:?}", file.display()))?;
        let id = self.add(name, parent, file);
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        self.scan(id, &tokens, true, child_dir)?;
        Ok(id)
    }

    fn add(&mut self, name: &str, parent: Option<ModId>, file: &Path) -> ModId {
        let id = self.modules.len();
        self.modules.push(Module {
            parent,
            file: file.to_path_buf(),
            ..Module::default()
        });
        if let Some(p) = parent {
            // Two `mod x` under different `cfg`s: the first is the one paths find.
            self.modules[p]
                .children
                .entry(name.to_string())
                .or_insert(id);
        }
        id
    }

    /// Reads module `m`'s tokens; `top` says whether they are the module's own level (items and
    /// imports there belong to the module) or inside a block.
    fn scan(
        &mut self,
        m: ModId,
        tokens: &[TokenTree],
        top: bool,
        child_dir: &Path,
    ) -> Result<(), String> {
        let mut path_attr: Option<String> = None;
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                // An attribute, `#[…]` or `#![…]`: skipped (its paths name macros, lints and
                // `cfg`s), except `#[path = "…"]`, which says where the next `mod` is.
                TokenTree::Punct(p) if p.as_char() == '#' => {
                    let j = if is_punct(tokens.get(i + 1), '!') {
                        i + 2
                    } else {
                        i + 1
                    };
                    match tokens.get(j) {
                        Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Bracket => {
                            if let Some(p) = path_attribute(g.stream()) {
                                path_attr = Some(p);
                            }
                            i = j + 1;
                        }
                        _ => i += 1,
                    }
                }
                TokenTree::Ident(kw) if kw == "mod" => {
                    let (Some(TokenTree::Ident(name)), Some(next)) =
                        (tokens.get(i + 1), tokens.get(i + 2))
                    else {
                        i += 1;
                        continue;
                    };
                    let name = name.to_string();
                    match next {
                        TokenTree::Punct(p) if p.as_char() == ';' => {
                            let here = &self.modules[m].file;
                            let (file, dir) = match path_attr.take() {
                                Some(p) => {
                                    let file = here.parent().unwrap_or(Path::new(".")).join(p);
                                    let dir = file.parent().unwrap_or(Path::new(".")).to_path_buf();
                                    (file, dir)
                                }
                                None => module_file(child_dir, &name, here)?,
                            };
                            self.load_file(&file, &name, Some(m), &dir)?;
                        }
                        TokenTree::Group(g) if g.delimiter() == Delimiter::Brace => {
                            let file = self.modules[m].file.clone();
                            let child = self.add(&name, Some(m), &file);
                            let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                            self.scan(child, &inner, true, &child_dir.join(&name))?;
                        }
                        _ => {}
                    }
                    i += 3;
                }
                TokenTree::Ident(kw) if kw == "use" => {
                    let end = (i + 1..tokens.len())
                        .find(|&j| is_punct(tokens.get(j), ';'))
                        .unwrap_or(tokens.len());
                    let line = kw.span().start().line;
                    let mut leaves = Vec::new();
                    use_tree(&tokens[i + 1..end], &[], &mut leaves);
                    for leaf in leaves {
                        self.import(m, top, leaf, line);
                    }
                    i = end + 1;
                }
                // A macro's body: its paths are resolved where it is expanded, except the
                // crate's own (`$crate::…`), which are the only ones read here.
                TokenTree::Ident(kw) if kw == "macro_rules" && is_punct(tokens.get(i + 1), '!') => {
                    if let (Some(TokenTree::Ident(name)), Some(TokenTree::Group(body))) =
                        (tokens.get(i + 2), tokens.get(i + 3))
                    {
                        if top {
                            self.modules[m].items.insert(name.to_string());
                        }
                        self.scan_macro_body(m, body.stream());
                        i += 4;
                    } else {
                        i += 1;
                    }
                }
                // An item's keyword (`'static` is a lifetime, not one).
                TokenTree::Ident(kw)
                    if top
                        && ITEM_KEYWORDS.contains(&kw.to_string().as_str())
                        && !is_punct(i.checked_sub(1).and_then(|b| tokens.get(b)), '\'') =>
                {
                    if let Some(name) = item_name(&tokens[i..]) {
                        self.modules[m].items.insert(name);
                    }
                    i += 1;
                }
                TokenTree::Group(g) => {
                    let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                    self.scan(m, &inner, false, child_dir)?;
                    i += 1;
                }
                _ => match path_at(tokens, i) {
                    Some((path, line, next)) => {
                        if path.len() >= 2 {
                            self.modules[m].refs.push(Ref {
                                path,
                                line,
                                kind: RefKind::Code,
                            });
                        } else if !field_or_binding(tokens, i, next) {
                            self.modules[m]
                                .names
                                .extend(path.into_iter().map(|n| (n, line)));
                        }
                        i = next;
                    }
                    None => i += 1,
                },
            }
        }
        Ok(())
    }

    /// Records the crate-absolute paths (`$crate::…`, `crate::…`) of a `macro_rules!` body.
    fn scan_macro_body(&mut self, m: ModId, body: TokenStream) {
        let tokens: Vec<TokenTree> = body.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let TokenTree::Group(g) = &tokens[i] {
                self.scan_macro_body(m, g.stream());
                i += 1;
                continue;
            }
            match path_at(&tokens, i) {
                Some((path, line, next)) => {
                    if path.len() >= 2 && path[0] == "crate" {
                        self.modules[m].refs.push(Ref {
                            path,
                            line,
                            kind: RefKind::Code,
                        });
                    }
                    i = next;
                }
                None => i += 1,
            }
        }
    }

    fn import(&mut self, m: ModId, top: bool, leaf: Leaf, line: usize) {
        let module = &mut self.modules[m];
        let kind = if leaf.glob {
            let globs = if top {
                &mut module.globs
            } else {
                &mut module.block_globs
            };
            globs.push(leaf.path.clone());
            RefKind::Glob
        } else {
            if let Some(name) = leaf.name {
                let imports = if top {
                    &mut module.imports
                } else {
                    &mut module.block_imports
                };
                imports.insert(name, leaf.path.clone());
            }
            RefKind::Use
        };
        module.refs.push(Ref {
            path: leaf.path,
            line,
            kind,
        });
    }
}

/// The keywords that start an item whose name follows (`macro_rules!` has a `!` between).
const ITEM_KEYWORDS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "union",
    "trait",
    "type",
    "const",
    "static",
    "macro_rules",
];

/// The name of the item whose keyword starts `tokens`: `const fn f` is left to `fn`, `static mut
/// X` is `X`, `const _` names nothing.
fn item_name(tokens: &[TokenTree]) -> Option<String> {
    let mut rest = tokens.get(1..)?;
    if is_punct(rest.first(), '!') {
        rest = &rest[1..];
    }
    if matches!(rest.first(), Some(TokenTree::Ident(i)) if i == "mut") {
        rest = &rest[1..];
    }
    match rest.first() {
        Some(TokenTree::Ident(name)) => {
            let name = name.to_string();
            let keyword = ["fn", "unsafe", "extern", "async", "_", "for"].contains(&name.as_str());
            (!keyword).then_some(name)
        }
        _ => None,
    }
}

/// `mod name;` declared in `declarer`, looked for in `dir`: `name.rs` or `name/mod.rs`. Returns
/// the file and where its own children are.
fn module_file(dir: &Path, name: &str, declarer: &Path) -> Result<(PathBuf, PathBuf), String> {
    let flat = dir.join(format!("{name}.rs"));
    let nested = dir.join(name).join("mod.rs");
    match (flat.exists(), nested.exists()) {
        (true, false) => Ok((flat, dir.join(name))),
        (false, true) => Ok((nested, dir.join(name))),
        (true, true) => Err(format!(
            "{} declares `mod {name}`, and both {} and {} exist",
            declarer.display(),
            flat.display(),
            nested.display()
        )),
        (false, false) => Err(format!(
            "{} declares `mod {name}`, but neither {} nor {} exists",
            declarer.display(),
            flat.display(),
            nested.display()
        )),
    }
}

/// `path = "…"` inside an attribute's brackets.
fn path_attribute(stream: TokenStream) -> Option<String> {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    match tokens.as_slice() {
        [TokenTree::Ident(k), TokenTree::Punct(eq), TokenTree::Literal(lit)]
            if k == "path" && eq.as_char() == '=' =>
        {
            let quoted = lit.to_string();
            Some(quoted.trim_matches('"').to_string())
        }
        _ => None,
    }
}

/// Whether the lone name at `tokens[at]` (ending before `next`) is a field or method (after
/// `.`) or a field or binding being named (before a single `:`), not a name looked up.
fn field_or_binding(tokens: &[TokenTree], at: usize, next: usize) -> bool {
    let after_dot = is_punct(at.checked_sub(1).and_then(|b| tokens.get(b)), '.');
    let before_colon = is_punct(tokens.get(next), ':') && !is_punct(tokens.get(next + 1), ':');
    after_dot || before_colon
}

fn is_punct(t: Option<&TokenTree>, c: char) -> bool {
    matches!(t, Some(TokenTree::Punct(p)) if p.as_char() == c)
}

/// Whether `tokens[i..]` starts with `::` followed by an identifier.
fn path_sep_at(tokens: &[TokenTree], i: usize) -> bool {
    matches!(tokens.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
        && is_punct(tokens.get(i + 1), ':')
        && matches!(tokens.get(i + 2), Some(TokenTree::Ident(_)))
}

/// The path starting at `tokens[i]`, if a path starts there: its segments, its line, and the
/// index after it. A path starts at an identifier (or `$crate`) that does not follow `::` (a
/// later segment) or `$` (a macro's variable).
fn path_at(tokens: &[TokenTree], i: usize) -> Option<(Vec<String>, usize, usize)> {
    let (first, line, mut j) = match &tokens[i] {
        TokenTree::Ident(id) => {
            let after_sep = i >= 2
                && is_punct(tokens.get(i - 1), ':')
                && matches!(tokens.get(i - 2), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint);
            let after_dollar = i >= 1 && is_punct(tokens.get(i - 1), '$');
            if after_sep || after_dollar {
                return None;
            }
            (id.to_string(), id.span().start().line, i + 1)
        }
        TokenTree::Punct(p) if p.as_char() == '$' => match tokens.get(i + 1) {
            Some(TokenTree::Ident(id)) if id == "crate" => {
                ("crate".to_string(), id.span().start().line, i + 2)
            }
            _ => return None,
        },
        _ => return None,
    };
    let mut path = vec![first];
    while path_sep_at(tokens, j) {
        if let Some(TokenTree::Ident(seg)) = tokens.get(j + 2) {
            path.push(seg.to_string());
        }
        j += 3;
    }
    Some((path, line, j))
}

/// One name a `use` brings in.
struct Leaf {
    path: Vec<String>,
    /// The name it is known by in the module (`None`: a glob, or `as _`).
    name: Option<String>,
    glob: bool,
}

/// The leaves of the use tree `tokens` (after `use`, before `;`), each path prefixed by `prefix`.
fn use_tree(tokens: &[TokenTree], prefix: &[String], out: &mut Vec<Leaf>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    if is_punct(tokens.first(), ':') {
        // `use ::name::…`: an extern crate.
        path.push("::".to_string());
        i = 2;
    }
    loop {
        match tokens.get(i) {
            Some(TokenTree::Ident(id)) => {
                let seg = id.to_string();
                if is_punct(tokens.get(i + 1), ':') {
                    path.push(seg);
                    i += 3;
                    continue;
                }
                let alias = match (tokens.get(i + 1), tokens.get(i + 2)) {
                    (Some(TokenTree::Ident(r#as)), Some(TokenTree::Ident(alias)))
                        if r#as == "as" =>
                    {
                        Some(alias.to_string())
                    }
                    _ => None,
                };
                let own_name = if seg == "self" {
                    path.last().cloned().unwrap_or_default()
                } else {
                    path.push(seg.clone());
                    seg
                };
                let name = alias.unwrap_or(own_name);
                out.push(Leaf {
                    path,
                    name: (name != "_").then_some(name),
                    glob: false,
                });
                return;
            }
            Some(TokenTree::Punct(p)) if p.as_char() == '*' => {
                out.push(Leaf {
                    path,
                    name: None,
                    glob: true,
                });
                return;
            }
            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Brace => {
                let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                for part in inner.split(|t| is_punct(Some(t), ',')) {
                    if !part.is_empty() {
                        use_tree(part, &path, out);
                    }
                }
                return;
            }
            _ => return,
        }
    }
}

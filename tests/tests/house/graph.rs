//! Which file uses which, and the circles among them.
//!
//! An edge from file A to file B means: code in A names an item that B defines. Each path a module
//! names ([`Ref`](super::modules::Ref)) is resolved as rustc resolves it: from `crate::`,
//! `self::`, `super::`, a child module, or a name the module imported (whose own path is resolved
//! in turn, so re-exports are seen through: `super::Tensor`, where the parent only has
//! `pub use tensor::Tensor`, is an edge to `tensor.rs`, not to the parent). Then:
//!
//! - a `use` leaf or a path in code that ends at an item is an edge to the item's file;
//! - a glob `use m::*` is an edge to each file whose item one of the module's lone names finds
//!   through it (a name bound locally that shadows such an item is counted too: tokens do not
//!   tell the two apart);
//! - a path that ends at a module (`use super::snapshot::{self}`) is no edge by itself: the paths
//!   through it are;
//! - a name a module does not visibly define (an item a macro makes) counts as the module's;
//! - never an edge: declaring a module (`mod x;`), doc links and other text, attributes, paths
//!   into other crates (cargo already forbids circles between crates), a file to itself (so an
//!   inline `mod tests { use super::*; }` is no edge).
//!
//! So a parent that only declares and re-exports its children is used by no child; a parent
//! whose own items a child uses is a circle as soon as the parent uses that child.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use super::modules::{Crate, ModId, RefKind};

/// What a path names.
#[derive(Clone, Copy)]
pub enum Target {
    /// The module itself.
    Module(ModId),
    /// An item defined in the module.
    Item(ModId),
}

/// What a name is, as a module knows it.
enum Name {
    In(Target),
    /// Imported from another crate.
    Outside,
    /// Not a name this module defines or imports (a local, a prelude name, an item a macro made).
    Unknown,
}

impl Crate {
    /// What `path`, written in module `from`, names; `None` for a path out of the crate (another
    /// crate, `std`, `Self::`, a generic).
    pub fn resolve(&self, from: ModId, path: &[String]) -> Option<Target> {
        self.resolve_in(from, path, &mut Vec::new())
    }

    /// `seen`: the (module, name) lookups under way, so that an import circle in the code (which
    /// rustc refuses) cannot loop here.
    fn resolve_in(
        &self,
        from: ModId,
        path: &[String],
        seen: &mut Vec<(ModId, String)>,
    ) -> Option<Target> {
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "crate" => 0,
            "self" => from,
            "super" => self.modules[from].parent?,
            "::" => return None,
            name => match self.lookup(from, name, true, seen) {
                Name::In(Target::Module(m)) => m,
                Name::In(item) => return Some(item),
                Name::Outside | Name::Unknown => return None,
            },
        };
        for seg in rest {
            match seg.as_str() {
                "super" => at = self.modules[at].parent?,
                "self" => {}
                name => match self.lookup(at, name, false, seen) {
                    Name::In(Target::Module(m)) => at = m,
                    Name::In(item) => return Some(item),
                    Name::Outside => return None,
                    // Made by a macro in the module (`include_proto!`), most likely: its own.
                    Name::Unknown => return Some(Target::Item(at)),
                },
            }
        }
        Some(Target::Module(at))
    }

    /// `name` as module `m` knows it: a child module, its own item, or an import (with
    /// `in_blocks`, also the imports inside its blocks: for paths written in `m` itself).
    fn lookup(
        &self,
        m: ModId,
        name: &str,
        in_blocks: bool,
        seen: &mut Vec<(ModId, String)>,
    ) -> Name {
        let module = &self.modules[m];
        if let Some(&child) = module.children.get(name) {
            return Name::In(Target::Module(child));
        }
        if module.items.contains(name) {
            return Name::In(Target::Item(m));
        }
        if seen.iter().any(|(sm, sn)| *sm == m && sn == name) {
            return Name::Unknown;
        }
        seen.push((m, name.to_string()));
        let import = module
            .imports
            .get(name)
            .or_else(|| in_blocks.then(|| module.block_imports.get(name)).flatten());
        let found = match import {
            Some(path) => self
                .resolve_in(m, path, seen)
                .map_or(Name::Outside, Name::In),
            None => {
                let blocks = if in_blocks {
                    &module.block_globs[..]
                } else {
                    &[]
                };
                let mut found = Name::Unknown;
                for glob in module.globs.iter().chain(blocks) {
                    if let Some(Target::Module(g)) = self.resolve_in(m, glob, seen) {
                        match self.lookup(g, name, false, seen) {
                            Name::Unknown => {}
                            known => {
                                found = known;
                                break;
                            }
                        }
                    }
                }
                found
            }
        };
        seen.pop();
        found
    }
}

/// Where a file first uses another.
#[derive(Clone, Debug)]
pub struct Evidence {
    pub line: usize,
    pub path: String,
}

/// Files, and for each the files it uses.
#[derive(Default)]
pub struct FileGraph {
    pub edges: BTreeMap<PathBuf, BTreeMap<PathBuf, Evidence>>,
}

impl FileGraph {
    pub fn add_crate(&mut self, krate: &Crate) {
        for (m, module) in krate.modules.iter().enumerate() {
            let uses = self.edges.entry(module.file.clone()).or_default();
            let mut used = Vec::new();
            for r in module.refs.iter().filter(|r| r.kind != RefKind::Glob) {
                if let Some(Target::Item(t)) = krate.resolve(m, &r.path) {
                    used.push((t, r.line, r.path.join("::")));
                }
            }
            // What a glob brought in is used by name: each lone name the module neither defines
            // nor imports by name is looked up through its globs.
            if !module.globs.is_empty() || !module.block_globs.is_empty() {
                for (name, line) in &module.names {
                    let named = module.items.contains(name)
                        || module.children.contains_key(name)
                        || module.imports.contains_key(name)
                        || module.block_imports.contains_key(name);
                    if named {
                        continue;
                    }
                    if let Some(Target::Item(t)) = krate.resolve(m, std::slice::from_ref(name)) {
                        used.push((t, *line, format!("{name} (from a glob import)")));
                    }
                }
            }
            for (target, line, path) in used {
                let to = &krate.modules[target].file;
                if *to != module.file {
                    uses.entry(to.clone()).or_insert(Evidence { line, path });
                }
            }
        }
    }

    fn reach(&self, from: &Path) -> BTreeSet<PathBuf> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_path_buf()];
        while let Some(f) = todo.pop() {
            for next in self.edges.get(&f).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    }

    /// Every set of two or more files that use one another in a circle (a strongly connected
    /// set), each with one shortest circle through its first file.
    pub fn circles(&self) -> Vec<(BTreeSet<PathBuf>, Vec<PathBuf>)> {
        let reach: BTreeMap<&PathBuf, BTreeSet<PathBuf>> =
            self.edges.keys().map(|f| (f, self.reach(f))).collect();
        let mut placed = BTreeSet::new();
        let mut found = Vec::new();
        for (f, from_f) in &reach {
            if placed.contains(*f) || !from_f.contains(*f) {
                continue;
            }
            let set: BTreeSet<PathBuf> = from_f
                .iter()
                .filter(|g| reach.get(g).is_some_and(|r| r.contains(*f)))
                .cloned()
                .collect();
            placed.extend(set.iter().cloned());
            let circle = self.shortest_circle(f, &set);
            found.push((set, circle));
        }
        found
    }

    /// The shortest path from `start` back to it inside `set`, `start` at both ends.
    fn shortest_circle(&self, start: &PathBuf, set: &BTreeSet<PathBuf>) -> Vec<PathBuf> {
        let mut came_from: BTreeMap<PathBuf, PathBuf> = BTreeMap::new();
        let mut todo = VecDeque::from([start.clone()]);
        while let Some(f) = todo.pop_front() {
            for next in self.edges.get(&f).into_iter().flat_map(|e| e.keys()) {
                if next == start {
                    let mut circle = vec![start.clone(), f.clone()];
                    let mut at = f.clone();
                    while let Some(prev) = came_from.get(&at) {
                        circle.push(prev.clone());
                        at = prev.clone();
                    }
                    if circle.last() != Some(start) {
                        circle.push(start.clone());
                    }
                    circle.reverse();
                    return circle;
                }
                if set.contains(next) && !came_from.contains_key(next) {
                    came_from.insert(next.clone(), f.clone());
                    todo.push_back(next.clone());
                }
            }
        }
        vec![start.clone()]
    }
}

//! The graph of a library crate's top-level modules: which uses which, read from the source
//! text with simple rules (no compiler, no dependency). `lex` turns a file into tokens, this
//! module finds the files and references, and `scc` finds the cycles.
//!
//! The rules, conservative where they guess:
//! - Nodes are the modules `src/lib.rs` declares with `mod name;`. Every file of such a
//!   module (its `name.rs` or `name/mod.rs`, and the files of its submodules, found by
//!   following their `mod` declarations, `#[path = "..."]` included) belongs to its node. The
//!   crate root itself is not a node: it declares every module and re-exports their items, so
//!   counting it would put every module in one cycle.
//! - Test modules (`#[cfg(test)] mod name;` or `mod name { ... }`, at any depth) are not
//!   read: a crate's tests may use any of its modules, and are built only for testing. Other
//!   code under `#[cfg(test)]` (a test-only method) counts like any other.
//! - A reference is a path starting with `crate::` (also `$crate::` in a macro) or with
//!   `super::` chains that climb to the crate root; anything in a `use` statement or in code.
//!   Comments (doc links included) and string literals are not read.
//! - The first segment after the root names the target: a top-level module; or a name the
//!   root imports (`pub use m::Name;`, `use m::{A, b::C as D};`), which resolves to the module
//!   it comes from; or, through a root glob (`pub use m::*;`), a name that `m`'s own file
//!   declares `pub` at its top level; or a `#[macro_export]` macro, which resolves to the
//!   module defining it. Anything else (an item the root defines itself, a name of another
//!   crate) is no edge. `crate::{a, B}` names each element.
//! - `super::` that stays inside a top-level module (from a submodule, or from an inline
//!   `mod tests { use super::*; }`) is no edge; nor is a module's reference to itself.
//! - Inline modules (`mod name { ... }`) are tracked so `super::` is resolved from the right
//!   depth; a `mod` inside an inline module of the root is not a node.

pub mod lex;
pub mod scc;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use lex::{Tok, Token, tokenize};
pub use scc::Graph;

/// Where one edge of the graph was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The file, relative to the crate's `src`.
    pub file: PathBuf,
    /// The line.
    pub line: usize,
    /// The path as written, up to its first segment after the root (`crate::list`).
    pub path: String,
}

/// A crate's module graph.
#[derive(Debug, Default)]
pub struct CrateGraph {
    /// Each top-level module and the modules it uses.
    pub graph: Graph,
    /// The first place each edge was seen.
    pub evidence: BTreeMap<(String, String), Evidence>,
}

impl CrateGraph {
    /// The cycles: components of more than one module, each sorted.
    pub fn cycles(&self) -> Vec<Vec<String>> {
        scc::cycles(&self.graph)
    }

    /// A cycle through `component`, with where each of its edges was seen, one per line:
    /// `a -> b (a.rs:12 crate::b)`.
    pub fn explain(&self, component: &[String]) -> String {
        let path = scc::cycle_through(&self.graph, component);
        let mut text = String::new();
        for pair in path.windows(2) {
            let (from, to) = (&pair[0], &pair[1]);
            let seen = match self.evidence.get(&(from.clone(), to.clone())) {
                Some(e) => format!("{}:{} {}", e.file.display(), e.line, e.path),
                None => "?".to_owned(),
            };
            text.push_str(&format!("    {from} -> {to}  ({seen})\n"));
        }
        text
    }
}

/// Reads a file's text (`None`: no such file). The tests give an in-memory crate.
pub type Read<'a> = &'a dyn Fn(&Path) -> Option<String>;

/// Builds the graph of the crate whose `src` directory is `src`.
pub fn crate_graph(src: &Path, read: Read<'_>) -> Result<CrateGraph, String> {
    let root_path = src.join("lib.rs");
    let root_text = read(&root_path).ok_or_else(|| format!("{} not found", root_path.display()))?;
    let root = scan(&tokenize(&root_text));
    let modules: BTreeSet<String> = root
        .mods
        .iter()
        .filter(|m| m.inline.is_empty())
        .map(|m| m.name.clone())
        .collect();

    // Every file of every top-level module, with its module path.
    let mut files: Vec<Loaded> = Vec::new();
    for decl in root.mods.iter().filter(|m| m.inline.is_empty()) {
        let (file, children) = child_file(read, src, &root_path, src, decl)?;
        load(
            read,
            src,
            file,
            vec![decl.name.clone()],
            children,
            &mut files,
        )?;
    }

    // What the root's names resolve to.
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut globs: Vec<String> = Vec::new();
    for leaf in &root.uses {
        let mut path = leaf.path.as_slice();
        if let [first, rest @ ..] = path
            && (first == "crate" || first == "self")
        {
            path = rest;
        }
        let Some(module) = path.first().filter(|m| modules.contains(*m)) else {
            continue;
        };
        match &leaf.name {
            Some(name) => {
                names.insert(name.clone(), module.clone());
            }
            None if path.len() == 1 => globs.push(module.clone()),
            // A glob of a submodule: its names are not read; nothing resolves through it.
            None => {}
        }
    }
    for loaded in &files {
        let node = &loaded.module[0];
        for name in &loaded.scan.macros {
            names.entry(name.clone()).or_insert_with(|| node.clone());
        }
        if loaded.module.len() == 1 && globs.contains(node) {
            for name in &loaded.scan.defs {
                names.entry(name.clone()).or_insert_with(|| node.clone());
            }
        }
    }
    let resolve = |name: &str| -> Option<String> {
        if modules.contains(name) {
            Some(name.to_owned())
        } else {
            names.get(name).cloned()
        }
    };

    let mut graph = CrateGraph::default();
    for module in &modules {
        graph.graph.entry(module.clone()).or_default();
    }
    for loaded in &files {
        let node = &loaded.module[0];
        for reference in &loaded.scan.refs {
            let depth = loaded.module.len() + reference.inline.len();
            let at_root = match reference.supers {
                None => true,
                Some(n) => n == depth,
            };
            if !at_root {
                continue;
            }
            for first in &reference.firsts {
                let Some(target) = resolve(first) else {
                    continue;
                };
                if &target == node {
                    continue;
                }
                graph
                    .graph
                    .entry(node.clone())
                    .or_default()
                    .insert(target.clone());
                let written = match reference.supers {
                    None => format!("crate::{first}"),
                    Some(n) => format!("{}{first}", "super::".repeat(n)),
                };
                graph
                    .evidence
                    .entry((node.clone(), target))
                    .or_insert_with(|| Evidence {
                        file: loaded.file.strip_prefix(src).unwrap_or(&loaded.file).into(),
                        line: reference.line,
                        path: written,
                    });
            }
        }
    }
    Ok(graph)
}

/// One file of a top-level module.
struct Loaded {
    file: PathBuf,
    /// Its module path: the top-level module first.
    module: Vec<String>,
    scan: Scan,
}

/// Loads `file` (module `module`) and, through their declarations, its submodules' files.
fn load(
    read: Read<'_>,
    src: &Path,
    file: PathBuf,
    module: Vec<String>,
    children: PathBuf,
    files: &mut Vec<Loaded>,
) -> Result<(), String> {
    let text = read(&file).ok_or_else(|| format!("{} not found", file.display()))?;
    let scan = scan(&tokenize(&text));
    let decls = scan.mods.clone();
    files.push(Loaded {
        file: file.clone(),
        module: module.clone(),
        scan,
    });
    for decl in &decls {
        let (child, grandchildren) = child_file(read, src, &file, &children, decl)?;
        let mut path = module.clone();
        path.extend(decl.inline.iter().cloned());
        path.push(decl.name.clone());
        load(read, src, child, path, grandchildren, files)?;
    }
    Ok(())
}

/// The file a `mod` declaration in `parent` names, and the directory of its own submodules.
/// `children`: where `parent`'s submodules live without a `#[path]`.
fn child_file(
    read: Read<'_>,
    src: &Path,
    parent: &Path,
    children: &Path,
    decl: &ModDecl,
) -> Result<(PathBuf, PathBuf), String> {
    if let Some(path) = &decl.path_attr {
        // Relative to the declaring file's directory; the file's own submodules live beside
        // it (it is read as a `mod.rs`).
        let dir = parent.parent().unwrap_or(src);
        let file = dir.join(path);
        let own = file.parent().unwrap_or(dir).to_path_buf();
        return Ok((file, own));
    }
    let mut base = children.to_path_buf();
    base.extend(&decl.inline);
    let flat = base.join(format!("{}.rs", decl.name));
    let folder = base.join(&decl.name);
    if read(&flat).is_some() {
        return Ok((flat, folder));
    }
    let nested = folder.join("mod.rs");
    if read(&nested).is_some() {
        return Ok((nested, folder));
    }
    Err(format!(
        "module `{}` declared in {} has no file ({} or {})",
        decl.name,
        parent.display(),
        flat.display(),
        nested.display()
    ))
}

/// A `mod name;` declaration.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ModDecl {
    name: String,
    /// Its `#[path = "..."]`, if any.
    path_attr: Option<String>,
    /// The inline modules it is declared in, outermost first.
    inline: Vec<String>,
}

/// A path that starts at the crate root or climbs with `super`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Ref {
    /// `None`: `crate::`; `Some(n)`: `n` times `super::`.
    supers: Option<usize>,
    /// The segments after the root: one, or each element of a `{...}` group.
    firsts: Vec<String>,
    /// The inline modules it is written in, outermost first.
    inline: Vec<String>,
    line: usize,
}

/// One name a `use` statement brings in.
#[derive(Clone, Debug, PartialEq, Eq)]
struct UseLeaf {
    /// The full path, as written.
    path: Vec<String>,
    /// The name it is bound to; `None` for a glob.
    name: Option<String>,
}

/// What one file says that matters here.
#[derive(Clone, Debug, Default)]
struct Scan {
    mods: Vec<ModDecl>,
    refs: Vec<Ref>,
    /// Leaves of `use` statements outside inline modules (read for the root's names).
    uses: Vec<UseLeaf>,
    /// Names declared `pub` at the file's top level (read for root globs).
    defs: Vec<String>,
    /// `#[macro_export]` macros: they live at the crate root.
    macros: Vec<String>,
}

fn ident(tokens: &[Token], i: usize) -> Option<&str> {
    match tokens.get(i).map(|t| &t.tok) {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

fn is(tokens: &[Token], i: usize, tok: &Tok) -> bool {
    tokens.get(i).is_some_and(|t| &t.tok == tok)
}

fn scan(tokens: &[Token]) -> Scan {
    let mut out = Scan::default();
    let mut depth = 0usize;
    // Inline modules open here: (name, the depth inside their braces).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut path_attr: Option<String> = None;
    let mut macro_export = false;
    let mut cfg_test = false;
    let mut i = 0;
    while i < tokens.len() {
        let here: Vec<String> = inline.iter().map(|(n, _)| n.clone()).collect();
        match &tokens[i].tok {
            Tok::Punct('{') => {
                depth += 1;
                path_attr = None;
                cfg_test = false;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                while inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
                path_attr = None;
                macro_export = false;
                cfg_test = false;
            }
            Tok::Punct(';') => {
                path_attr = None;
                macro_export = false;
                cfg_test = false;
            }
            Tok::Punct('#') if is(tokens, i + 1, &Tok::Punct('[')) => {
                match (ident(tokens, i + 2), tokens.get(i + 4).map(|t| &t.tok)) {
                    (Some("path"), Some(Tok::Str(p))) if is(tokens, i + 3, &Tok::Punct('=')) => {
                        path_attr = Some(p.clone());
                    }
                    (Some("macro_export"), _) => macro_export = true,
                    (Some("cfg"), _)
                        if is(tokens, i + 3, &Tok::Punct('('))
                            && ident(tokens, i + 4) == Some("test")
                            && is(tokens, i + 5, &Tok::Punct(')')) =>
                    {
                        cfg_test = true;
                    }
                    _ => {}
                }
            }
            Tok::Ident(word) => match word.as_str() {
                "mod" if !is(tokens, i.wrapping_sub(1), &Tok::PathSep) => {
                    if let Some(name) = ident(tokens, i + 1) {
                        if std::mem::take(&mut cfg_test) {
                            // A test module: skipped, with its braces if inline.
                            i = skip_item(tokens, i + 2);
                            path_attr = None;
                            continue;
                        }
                        if is(tokens, i + 2, &Tok::Punct(';')) {
                            out.mods.push(ModDecl {
                                name: name.to_owned(),
                                path_attr: path_attr.take(),
                                inline: here.clone(),
                            });
                        } else if is(tokens, i + 2, &Tok::Punct('{')) {
                            depth += 1;
                            inline.push((name.to_owned(), depth));
                            path_attr = None;
                            i += 3;
                            continue;
                        }
                    }
                }
                "macro_rules" if is(tokens, i + 1, &Tok::Punct('!')) => {
                    if let (true, Some(name)) = (macro_export, ident(tokens, i + 2)) {
                        out.macros.push(name.to_owned());
                    }
                    macro_export = false;
                }
                "use" if depth == 0 => {
                    let mut j = i + 1;
                    use_tree(tokens, &mut j, Vec::new(), &mut out.uses);
                }
                "pub" if depth == 0 => {
                    if let Some(name) = pub_item_name(tokens, i + 1) {
                        out.defs.push(name);
                    }
                }
                "crate" | "super"
                    if is(tokens, i + 1, &Tok::PathSep)
                        && !is(tokens, i.wrapping_sub(1), &Tok::PathSep) =>
                {
                    let line = tokens[i].line;
                    let mut supers = None;
                    let mut j = i;
                    if word == "super" {
                        let mut n = 0;
                        while ident(tokens, j) == Some("super") && is(tokens, j + 1, &Tok::PathSep)
                        {
                            n += 1;
                            j += 2;
                        }
                        supers = Some(n);
                    } else {
                        j += 2;
                    }
                    let firsts = first_segments(tokens, j);
                    if !firsts.is_empty() {
                        out.refs.push(Ref {
                            supers,
                            firsts,
                            inline: here,
                            line,
                        });
                    }
                    i = j;
                    continue;
                }
                _ => {}
            },
            _ => {}
        }
        i += 1;
    }
    out
}

/// The index after the item whose body starts at `at`: past its `;`, or past the `}` that
/// closes the `{` there.
fn skip_item(tokens: &[Token], at: usize) -> usize {
    if !is(tokens, at, &Tok::Punct('{')) {
        return at + 1;
    }
    let mut nesting = 0usize;
    for (k, token) in tokens.iter().enumerate().skip(at) {
        match token.tok {
            Tok::Punct('{') => nesting += 1,
            Tok::Punct('}') => {
                nesting -= 1;
                if nesting == 0 {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// The first segment of the path at `at`, or of each element of a `{...}` group there.
fn first_segments(tokens: &[Token], at: usize) -> Vec<String> {
    match tokens.get(at).map(|t| &t.tok) {
        Some(Tok::Ident(s)) if s != "self" => vec![s.clone()],
        Some(Tok::Punct('{')) => {
            let mut out = Vec::new();
            let mut nesting = 0usize;
            let mut expect_first = true;
            for token in &tokens[at + 1..] {
                match &token.tok {
                    Tok::Punct('{') => nesting += 1,
                    Tok::Punct('}') if nesting == 0 => break,
                    Tok::Punct('}') => nesting -= 1,
                    Tok::Punct(',') if nesting == 0 => expect_first = true,
                    Tok::Ident(s) if expect_first && nesting == 0 => {
                        if s != "self" {
                            out.push(s.clone());
                        }
                        expect_first = false;
                    }
                    _ => expect_first = false,
                }
            }
            out
        }
        _ => Vec::new(),
    }
}

/// Parses a use tree at `*i` (after `use`, or inside a group), adding its leaves to `out`.
fn use_tree(tokens: &[Token], i: &mut usize, prefix: Vec<String>, out: &mut Vec<UseLeaf>) {
    let mut path = prefix;
    while let Some(token) = tokens.get(*i) {
        match &token.tok {
            Tok::PathSep => *i += 1,
            Tok::Ident(segment) => {
                path.push(segment.clone());
                *i += 1;
                if is(tokens, *i, &Tok::PathSep) {
                    continue;
                }
                let mut name = segment.clone();
                if ident(tokens, *i) == Some("as")
                    && let Some(alias) = ident(tokens, *i + 1)
                {
                    name = alias.to_owned();
                    *i += 2;
                }
                if name == "self" && path.len() >= 2 {
                    name = path[path.len() - 2].clone();
                }
                if name != "_" {
                    out.push(UseLeaf {
                        path,
                        name: Some(name),
                    });
                }
                return;
            }
            Tok::Punct('*') => {
                *i += 1;
                out.push(UseLeaf { path, name: None });
                return;
            }
            Tok::Punct('{') => {
                *i += 1;
                while let Some(token) = tokens.get(*i) {
                    match token.tok {
                        Tok::Punct('}') => {
                            *i += 1;
                            return;
                        }
                        Tok::Punct(',') => *i += 1,
                        _ => {
                            let before = *i;
                            use_tree(tokens, i, path.clone(), out);
                            if *i == before {
                                // Not a tree: stop rather than loop.
                                return;
                            }
                        }
                    }
                }
                return;
            }
            _ => return,
        }
    }
}

/// The name of a `pub` item whose visibility ends at `at` (after `pub`, before any `(crate)`).
fn pub_item_name(tokens: &[Token], mut at: usize) -> Option<String> {
    if is(tokens, at, &Tok::Punct('(')) {
        // `pub(crate)` and the like: not visible through a glob outside the crate's modules,
        // but visible inside it; counted all the same.
        while !is(tokens, at, &Tok::Punct(')')) {
            at += 1;
            tokens.get(at)?;
        }
        at += 1;
    }
    loop {
        match &tokens.get(at)?.tok {
            Tok::Str(_) => at += 1,
            Tok::Ident(w) if matches!(w.as_str(), "unsafe" | "async" | "extern") => at += 1,
            Tok::Ident(w) if w == "const" => match ident(tokens, at + 1)? {
                "fn" | "unsafe" | "async" | "extern" => at += 1,
                name => return Some(name.to_owned()),
            },
            Tok::Ident(w)
                if matches!(
                    w.as_str(),
                    "struct" | "enum" | "trait" | "type" | "fn" | "static" | "union" | "mod"
                ) =>
            {
                let mut name_at = at + 1;
                if ident(tokens, name_at) == Some("mut") {
                    name_at += 1;
                }
                return ident(tokens, name_at).map(str::to_owned);
            }
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests;

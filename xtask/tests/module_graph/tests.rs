//! The graph builder on small crates held in memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::crate_graph;

/// Builds the graph of a crate given as (path under `src`, text) pairs.
fn graph_of(files: &[(&str, &str)]) -> super::CrateGraph {
    let src = PathBuf::from("/crate/src");
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(p, t)| (src.join(p), (*t).to_owned()))
        .collect();
    let read = |p: &Path| files.get(p).cloned();
    crate_graph(&src, &read).expect("the crate reads")
}

fn edges(graph: &super::CrateGraph) -> Vec<(String, String)> {
    graph
        .graph
        .iter()
        .flat_map(|(a, bs)| bs.iter().map(move |b| (a.clone(), b.clone())))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[test]
fn crate_paths_name_modules_directly_and_through_root_imports() {
    let g = graph_of(&[
        (
            "lib.rs",
            "mod a; mod b; mod c; mod d;\npub use b::{Bee, inner::Deep as Renamed};\nuse c::*;\n\
             pub struct RootOwn;",
        ),
        (
            "a.rs",
            "use crate::{Bee, RootOwn};\nfn f() { crate::Renamed::new(); let _ = crate::C; }",
        ),
        ("b.rs", "pub struct Bee; pub mod inner;"),
        ("b/inner.rs", "pub struct Deep;"),
        ("c.rs", "pub const C: u32 = 1; pub(crate) fn helper() {}"),
        ("d.rs", "fn g() { crate::helper(); crate::a::f(); }"),
    ]);
    assert_eq!(
        edges(&g),
        pairs(&[("a", "b"), ("a", "c"), ("d", "a"), ("d", "c")])
    );
    assert!(g.cycles().is_empty());
}

#[test]
fn a_cycle_through_a_chain_is_found_and_explained() {
    let g = graph_of(&[
        ("lib.rs", "mod a; mod b; mod c; mod d;"),
        ("a.rs", "use crate::b::X;"),
        ("b.rs", "pub struct X; fn f() -> crate::c::Y { todo!() }"),
        ("c.rs", "pub struct Y;\n\nuse super::a;"),
        ("d.rs", "use crate::a;"),
    ]);
    assert_eq!(g.cycles(), vec![vec!["a", "b", "c"]]);
    let explained = g.explain(&g.cycles()[0]);
    assert!(
        explained.contains("a -> b  (a.rs:1 crate::b)"),
        "{explained}"
    );
    assert!(
        explained.contains("c -> a  (c.rs:3 super::a)"),
        "{explained}"
    );
}

#[test]
fn comments_strings_and_doc_links_are_not_references() {
    let g = graph_of(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "use crate::b;"),
        (
            "b.rs",
            "//! See [`crate::a`].\n/// [`crate::a::f`]\n/* crate::a */ const S: &str = \"crate::a\";",
        ),
    ]);
    assert_eq!(edges(&g), pairs(&[("a", "b")]));
}

#[test]
fn super_is_an_edge_only_when_it_climbs_to_the_root() {
    let g = graph_of(&[
        ("lib.rs", "mod a; mod b; mod c;"),
        // From a submodule: `super` is `a`, `super::super` the root.
        ("a/mod.rs", "mod part;"),
        ("a/part.rs", "use super::Thing; use super::super::b;"),
        // An inline module's `super` is the file's module.
        ("b.rs", "mod inner { use super::*; use super::c; }"),
        // From a top-level file, `super` is the root.
        ("c.rs", "use super::{a, b};"),
    ]);
    assert_eq!(edges(&g), pairs(&[("a", "b"), ("c", "a"), ("c", "b")]));
}

#[test]
fn path_attributes_and_folder_modules_belong_to_their_top_level_module() {
    let g = graph_of(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "#[path = \"a_extra.rs\"]\nmod extra;\nmod nested;"),
        ("a_extra.rs", "use crate::b::B;"),
        ("a/nested.rs", "fn f() { crate::b::g() }"),
        ("b.rs", "pub struct B; fn g() { $crate::a::f() }"),
    ]);
    assert_eq!(edges(&g), pairs(&[("a", "b"), ("b", "a")]));
    assert_eq!(g.cycles(), vec![vec!["a", "b"]]);
    let e = &g.evidence[&("a".to_owned(), "b".to_owned())];
    assert_eq!(e.file, PathBuf::from("a_extra.rs"));
}

#[test]
fn exported_macros_resolve_to_their_module() {
    let g = graph_of(&[
        ("lib.rs", "mod a; mod b;"),
        ("a.rs", "#[macro_export]\nmacro_rules! m { () => {} }"),
        ("b.rs", "use crate::m;"),
    ]);
    assert_eq!(edges(&g), pairs(&[("b", "a")]));
}

#[test]
fn a_declared_module_without_a_file_is_an_error() {
    let src = PathBuf::from("/crate/src");
    let read = |p: &Path| (p == src.join("lib.rs")).then(|| "mod gone;".to_owned());
    let err = crate_graph(&src, &read).expect_err("gone.rs is missing");
    assert!(err.contains("`gone`"), "{err}");
}

#[test]
fn test_modules_are_not_read() {
    let g = graph_of(&[
        ("lib.rs", "mod a; mod b;\n#[cfg(test)]\nmod tests;"),
        (
            "a.rs",
            "#[cfg(test)]\nmod tests { use crate::b; mod deeper { fn f() { crate::b::g() } } }\n\
             #[cfg(test)]\nmod more;\nfn after() { crate::b::h() }",
        ),
        ("b.rs", "use crate::a;"),
    ]);
    // `tests.rs` and `a/more.rs` do not exist: test modules are not even opened.
    assert_eq!(edges(&g), pairs(&[("a", "b"), ("b", "a")]));
    let e = &g.evidence[&("a".to_owned(), "b".to_owned())];
    assert_eq!(e.line, 5, "the first edge outside the test modules");
}

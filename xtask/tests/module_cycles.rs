//! No import cycles between the top-level modules of a library crate: module `a` using `b`
//! while `b` uses `a` (directly or through a chain) ties their files into one unit that can
//! be neither read nor changed alone. The graph is read from the source text with the rules
//! documented in `module_graph`; a cycle fails the test, naming its modules and where each of
//! its edges is written.
//!
//! [`KNOWN_CYCLES`] lists cycles not broken yet, each with its reason; it only shrinks. A
//! cycle found is accepted when its modules are all in one listed entry; an entry that no
//! cycle overlaps any more fails the test, so the list is kept honest.

mod module_graph;

use std::path::{Path, PathBuf};

/// The library crates checked, by directory under `crates/`.
const CRATES: &[&str] = &[
    "sys",
    "semaphore",
    "scheduler",
    "command",
    "trace",
    "device",
];

/// Cycles known and not broken yet: (crate directory, the modules of the cycle, why).
const KNOWN_CYCLES: &[(&str, &[&str], &str)] = &[
    (
        "sys",
        &["api", "call", "error", "nccl"],
        "the `cu!` and `nccl!` macros (call) take a DriverApi (api) or an NcclApi (nccl); \
         loading either calls through the macros and reports errors that name the loaders' \
         environment variables",
    ),
    (
        "sys",
        &["context", "objects"],
        "a PrimaryContext loads Modules (objects), and the driver objects hold their \
         PrimaryContext",
    ),
    (
        "trace",
        &["context", "list", "submission"],
        "the context's shared state holds the pending zone lists and the submission slots, \
         and each list and slot holds the shared state (Arc both ways): breaking it takes \
         moving the state's types below all three, a design change rather than a move",
    ),
    (
        "device",
        &[
            "backend",
            "bindings",
            "collective",
            "device",
            "error",
            "event_pool",
            "interop",
            "lost",
            "memory",
            "queue",
        ],
        "Device, Queue, their backend and collectives use each other's types both ways \
         (device and queue, device and backend, error and lost): a design change, not a move",
    ),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

#[test]
fn library_crates_have_no_module_cycles() {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    let mut failures = Vec::new();
    let mut matched = vec![false; KNOWN_CYCLES.len()];
    for name in CRATES {
        let src = workspace().join("crates").join(name).join("src");
        let graph = match module_graph::crate_graph(&src, &read) {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{name}: cannot read the crate: {e}"));
                continue;
            }
        };
        for cycle in graph.cycles() {
            let known = KNOWN_CYCLES
                .iter()
                .enumerate()
                .find(|(_, (c, modules, _))| {
                    c == name && cycle.iter().all(|m| modules.contains(&m.as_str()))
                });
            if let Some((i, _)) = known {
                matched[i] = true;
                continue;
            }
            failures.push(format!(
                "{name}: modules {{{}}} form a cycle:\n{}",
                cycle.join(", "),
                graph.explain(&cycle)
            ));
        }
        for (i, (c, modules, _)) in KNOWN_CYCLES.iter().enumerate() {
            if c == name
                && !matched[i]
                && graph
                    .cycles()
                    .iter()
                    .any(|cycle| cycle.iter().any(|m| modules.contains(&m.as_str())))
            {
                matched[i] = true;
            }
        }
    }
    for (i, (c, modules, _)) in KNOWN_CYCLES.iter().enumerate() {
        if !matched[i] {
            failures.push(format!(
                "{c}: the known cycle {{{}}} is gone: remove it from KNOWN_CYCLES",
                modules.join(", ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles between modules:\n\n{}",
        failures.join("\n")
    );
}

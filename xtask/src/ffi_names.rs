//! The guard of the name-once rule: outside the modules that load the driver, NCCL and CUPTI
//! (and the fakes that implement them), no source names one of their functions, or one of
//! cuBLAS's, in a string literal. Calls go through `cu!`, `nccl!`, `cupti!` and `cublas!`, and
//! code that speaks of a call without making it uses `cu_name!`, `nccl_name!`, `cupti_name!`
//! and `cublas_name!`, which derive the name from the table's field, so a name can neither be
//! misspelled nor drift from the function called.
//!
//! A literal is flagged when its text starts with such a name: `cu`, `nccl`, `cupti` or
//! `cublas`, then an upper-case letter, then identifier characters with at least one lower-case
//! letter (function names are camel case: `cuGraphLaunch`, `ncclGroupEnd`, `cuptiGetTimestamp`,
//! `cublasSgemm_v2`; product names such as `cuBLAS` are not), up to the literal's end or a
//! character that cannot continue an identifier (`"ncclCommInitAll failed"` is flagged too).
//! Comments are not read.

use std::path::{Path, PathBuf};

/// Source folders scanned, relative to the workspace root: every crate's `src` (the glob
/// `crates/*/src`) and the GPU suite's support library.
const ROOTS: &[&str] = &["crates/*/src", "tests/src"];

/// Paths exempt from the rule, relative to the workspace root (a folder ends in `/`): the
/// loaders and the macros that derive the names, and the fakes that implement the symbols.
const EXEMPT: &[&str] = &[
    "crates/fake-driver/",
    "crates/sys/src/api.rs",
    "crates/sys/src/call.rs",
    "crates/sys/src/nccl.rs",
    "crates/trace/src/cupti/call.rs",
    "crates/trace/src/cupti/ffi.rs",
    "crates/trace/src/cupti/fake.rs",
    "crates/trace/src/cupti/load.rs",
];

/// Every `.rs` file under the scanned roots of `root`, less the exempt ones, sorted.
fn sources(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for pattern in ROOTS {
        match pattern.split_once("/*/") {
            Some((parent, child)) => {
                for entry in std::fs::read_dir(root.join(parent))? {
                    let dir = entry?.path().join(child);
                    if dir.is_dir() {
                        dirs.push(dir);
                    }
                }
            }
            None => dirs.push(root.join(pattern)),
        }
    }
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.retain(|path| !exempt(&relative(root, path)));
    files.sort();
    Ok(files)
}

/// `path` relative to `root`, with `/` separators.
fn relative(root: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(root).unwrap_or(path);
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

fn exempt(relative: &str) -> bool {
    EXEMPT.iter().any(|e| {
        if e.ends_with('/') {
            relative.starts_with(e)
        } else {
            relative == *e
        }
    })
}

/// The string literals of Rust source `text` (normal, raw, byte and C strings), each with the
/// line it starts on (from 1) and its text between the quotes (escapes left as written).
/// Comments, character literals and lifetimes are skipped.
fn string_literals(text: &str) -> Vec<(usize, String)> {
    let chars: Vec<char> = text.chars().collect();
    let mut found = Vec::new();
    let mut line = 1;
    let mut i = 0;
    // Advances over `chars[i..to]`, counting lines.
    let skip = |i: &mut usize, to: usize, line: &mut usize| {
        let to = to.min(chars.len());
        *line += chars[*i..to].iter().filter(|&&c| c == '\n').count();
        *i = to;
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            let end = chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(chars.len(), |p| i + p);
            skip(&mut i, end, &mut line);
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            let mut j = i;
            while j < chars.len() {
                if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            skip(&mut i, j, &mut line);
        } else if c == '"' {
            let start_line = line;
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            let end = j.min(chars.len());
            found.push((start_line, chars[i + 1..end].iter().collect()));
            skip(&mut i, end + 1, &mut line);
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), else a lifetime or label.
            if next == Some('\\') {
                let end = chars[i + 2..]
                    .iter()
                    .position(|&c| c == '\'')
                    .map_or(chars.len(), |p| i + 2 + p);
                skip(&mut i, end + 1, &mut line);
            } else if chars.get(i + 2) == Some(&'\'') {
                let end = i + 3;
                skip(&mut i, end, &mut line);
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
            let raw =
                matches!(word.as_str(), "r" | "br" | "cr") && chars.get(i + hashes) == Some(&'"');
            if raw {
                let start_line = line;
                let body = i + hashes + 1;
                let closing: String = std::iter::once('"')
                    .chain(std::iter::repeat_n('#', hashes))
                    .collect();
                let closing: Vec<char> = closing.chars().collect();
                let end = (body..=chars.len().saturating_sub(closing.len()))
                    .find(|&j| chars[j..j + closing.len()] == closing[..])
                    .unwrap_or(chars.len());
                found.push((start_line, chars[body..end].iter().collect()));
                skip(&mut i, end + closing.len(), &mut line);
            }
            // `b"..."` and `c"..."` continue at the quote, read as a normal string.
        } else {
            if c == '\n' {
                line += 1;
            }
            i += 1;
        }
    }
    found
}

/// The FFI function name `literal` starts with, if it starts with one (see the module
/// documentation).
fn ffi_name(literal: &str) -> Option<&str> {
    let end = literal
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(literal.len());
    let word = &literal[..end];
    ["cublas", "cupti", "nccl", "cu"].iter().find_map(|prefix| {
        let rest = word.strip_prefix(prefix)?;
        let mut chars = rest.chars();
        let camel = chars.next().is_some_and(|c| c.is_ascii_uppercase())
            && chars.any(|c| c.is_ascii_lowercase());
        camel.then_some(word)
    })
}

/// `path:line: "literal"` for every literal under `root` that names an FFI function.
fn violations(root: &Path) -> std::io::Result<Vec<String>> {
    let mut found = Vec::new();
    for path in sources(root)? {
        let text = std::fs::read_to_string(&path)?;
        for (line, literal) in string_literals(&text) {
            if ffi_name(&literal).is_some() {
                found.push(format!("{}:{line}: \"{literal}\"", relative(root, &path)));
            }
        }
    }
    Ok(found)
}

#[test]
fn no_source_names_an_ffi_function_in_a_string() {
    let root = crate::cargo::workspace_root();
    let scanned = sources(&root).expect("reading the sources");
    assert!(
        scanned.len() > 50 && scanned.iter().any(|p| p.ends_with("collective/group.rs")),
        "the scan found only {} files under {}",
        scanned.len(),
        root.display()
    );
    let found = violations(&root).expect("reading the sources");
    assert!(
        found.is_empty(),
        "string literals naming a driver, NCCL or CUPTI function (use cu!/nccl!/cupti! to \
         call it, cu_name!/nccl_name!/cupti_name! to name it):\n{}",
        found.join("\n")
    );
}

#[test]
fn names_are_told_from_other_words() {
    for named in [
        "cuGraphLaunch",
        "ncclAllReduce",
        "cuptiGetTimestamp",
        "cuMemAlloc_v2",
        "ncclCommInitAll failed ({r})",
        "cuD3D11GetDevice",
        "cublasSgemm_v2",
        "cublasSetStream_v2 failed",
    ] {
        assert!(ffi_name(named).is_some(), "{named}");
    }
    for other in [
        "cuBLAS not found",
        "cuda",
        "cuhal_nccl",
        "nccl",
        "CUDA_ERROR_OUT_OF_MEMORY",
        "raw ncclGroupEnd failed",
        "cuX",
        "cupti: off",
        "cublas",
        "cuBLAS SGEMM",
    ] {
        assert_eq!(ffi_name(other), None, "{other}");
    }
}

#[test]
fn literals_are_read_past_comments_chars_lifetimes_and_raw_strings() {
    let source = r####"
// "cuInComment"
/* "cuInBlock" /* nested "cuDeeper" */ still */
fn f<'a>(x: &'a str) -> char { let q = '"'; let e = '\''; '\u{22}' }
let s = "first \" still first";
let r = r#"raw "quoted" text"#;
let b = b"bytes"; let c = c"cstr";
let n = br##"x"# y"##;
"####;
    let literals = string_literals(source);
    let texts: Vec<&str> = literals.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        texts,
        [
            r#"first \" still first"#,
            r#"raw "quoted" text"#,
            "bytes",
            "cstr",
            r##"x"# y"##
        ]
    );
    assert_eq!(literals[0].0, 5);
    assert_eq!(literals[4].0, 8);
}

//! The layout ARCHITECTURE.md describes, checked: every room of the library names only rooms
//! on floors below it (or itself), never one above or beside it, and `src/` holds at most 12
//! files. A `crate::` path in code (comments aside) is what names a room.
//!
//! Fails (`... names ...`) when a lower room imports an upper one: tried by adding
//! `use crate::broker::Broker;` to `src/runtime/wake.rs`.

use std::path::{Path, PathBuf};

/// The rooms, by floor: a room may name rooms of lower floors and itself.
const FLOORS: &[(&str, u8)] = &[
    ("error", 0),
    ("model", 1),
    ("dialect", 2),
    ("runtime", 3),
    ("broker", 4),
    ("producing", 5),
    ("consuming", 5),
    ("operating", 6),
    ("json", 7),
    ("postgres", 7),
    ("mysql", 7),
    ("sqlite", 7),
    ("diesel", 7),
    ("testing", 7),
    ("races", 8),
    ("lib", 9),
];

fn floor(room: &str) -> Option<u8> {
    FLOORS.iter().find(|(r, _)| *r == room).map(|(_, f)| *f)
}

/// The room of a file under `src/`: its folder, or its own name directly in `src/`.
fn room_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The rooms `line` names with `crate::<room>`; a re-exported name (`crate::Broker`) names
/// the top of the house.
fn named(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let word: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if rest.starts_with('{') {
            // One room per `use` line, so each is checked.
            out.push("{ (a grouped crate:: import)".to_string());
        } else if word.starts_with(|c: char| c.is_uppercase()) {
            out.push("lib".to_string());
        } else if !word.is_empty() {
            out.push(word);
        }
    }
    out
}

#[test]
fn rooms_name_only_rooms_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(src.join("bin"))) {
        let room = room_of(&src, file);
        let Some(own) = floor(&room) else {
            wrong.push(format!(
                "{}: a room ARCHITECTURE.md does not name",
                file.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for target in named(line) {
                let ok = target == room || floor(&target).is_some_and(|f| f < own);
                if !ok {
                    wrong.push(format!(
                        "{}:{}: {room} names {target}: {}",
                        file.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn src_holds_at_most_twelve_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    assert!(
        files.len() <= 12,
        "{} files in src/: {files:?}",
        files.len()
    );
}

#[test]
fn the_checker_sees_names() {
    assert_eq!(named("use crate::runtime::Queue;"), ["runtime"]);
    assert_eq!(named("let b = crate::Broker::connect(u);"), ["lib"]);
    assert_eq!(
        named("pub(crate) use crate::dialect::conn::DbConn;"),
        ["dialect"]
    );
    assert_eq!(
        named("use crate::{a, b};"),
        ["{ (a grouped crate:: import)"]
    );
    assert!(named("use std::collections::HashMap;").is_empty());
    assert!(named("let x = mycrate::runtime::y;").is_empty());
}
